"""What kind of kernel a PrimFunc is: the one classification the schedule registry, the tuner and
the manifest read.

A Kiln compute declares its kind on its anchor stage (the block its rule anchors on) the way TVM's
topi declares a `schedule_rule`: `te.compute(..., attrs=kinds.declare("winograd"))` becomes a
block annotation after create_prim_func, and FuseTIR keeps it in the fused kernel. The other stages
of that compute (its padding, transforms, epilogue) are part of the anchor's kernel and carry
nothing; a kernel with no blocks (Kiln's C kernels) carries the kind as a PrimFunc attribute.
TVM's own computes are classified by the `schedule_rule` TOPI sets (pools), else by structure and
the names TOPI gives their reduction blocks (TOPI_REDUCTIONS). A value that is not a known kind is
an error (KernelKindError), never a silent generic rule.

The kind is Kiln's metadata, not part of the computation: `strip` removes it where kernels meet
MetaSchedule's database, so records key on the computation (databases tuned before the kinds
existed still match, and reclassifying a compute keeps its records). Kiln's own key, not TOPI's:
MetaSchedule looks up a custom rule for every `schedule_rule` and warns when there is none."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .rules import COMM_REDUCE, blocks, iter_types

ATTR = "kiln.kernel_kind"  # a Kiln compute's anchor block annotation (a PrimFunc attribute where it has no blocks)
TVM_ATTR = "schedule_rule"  # TOPI's block annotation: the name of a MetaSchedule custom rule

KINDS = {  # kind -> what has it; registry.RULES maps each (but SCHEDULED) to a rule per target family
    "conv2d": "direct conv2d (topi conv2d_NCHWc and others TOPI names conv2d*; legalize.depthwise_conv2d_nchwc)",
    "conv2d_nchw": "topi's NCHW conv2d",
    "depthwise_nchw": "topi's grouped NCHW conv2d (the rule takes depthwise ones: one input channel per group)",
    "conv3d": "NCDHW conv3d with output channels blocked in the weights (compiler/legalize_conv3d)",
    "conv2d_int8": "uint8 x int8 NCHWc conv2d (legalize_int8.conv2d_nchwc_int8; topi's conv2d_NCHWc_int8)",
    "matmul_int8": "uint8 x int8 matmul by packed weights (legalize_int8.matmul_int8)",
    "conv2d_amx": "uint8 x int8 conv2d as a GEMM per output row on AMX tiles (legalize_amx.conv2d_amx)",
    "matmul": "matmul / dense (topi; passes/pack_dense_weights.matmul_packed)",
    "pool": "pooling (topi's, annotated meta_schedule.pool_* / adaptive_pool_*)",
    "reduction": "any other single reduction (legalize's max/min with infinite identities, topi's sum, mean)",
    "multi_reduction": "several reductions (topi's layer norm, softmax)",
    "softmax": "legalize.softmax_fast_exp",
    "injective": "no reduction",
    "layout_transform": "relax's layout_transform (one te_layout_transform block)",
    "winograd": "compiler/winograd.conv2d_winograd_nchwc",
    "depthwise_pointwise": "passes/fuse_depthwise_pointwise.dwpw_conv2d",
    "bf16_conv": "passes/bf16_conv_kernel: the caller of the vdpbf16ps C kernel (comes scheduled)",
    "attention": "passes/fuse_attention: the caller of the fused attention C kernel (comes scheduled)",
    "bf16_matmul": "passes/bf16_matmul_kernel: the caller of the bf16 matmul C kernel (comes scheduled)",
    "fp16_matmul": "passes/fp16_matmul_kernel: the caller of the arm64 fp16 matmul C kernel (comes scheduled)",
    "f32_matmul": "passes/f32_matmul_kernel: the caller of the AVX-512 float32 matmul C kernel (comes scheduled)",
    "f32_conv": "passes/f32_conv_kernel: the caller of the AVX-512 float32 conv C kernel (comes scheduled)",
}
SCHEDULED = frozenset(
    {"bf16_conv", "attention", "bf16_matmul", "fp16_matmul", "f32_matmul", "f32_conv"}
)  # kinds whose kernels come scheduled: no rule
# kinds whose default schedule is a hand-written tile kernel: MetaSchedule's search space (no AMX intrinsics)
# holds nothing faster, so kiln tune spends no trials on them
UNTUNED = frozenset({"conv2d_amx"})
TVM_RULES = {  # every schedule_rule TVM 0.27's TOPI sets -> kind; None: it says nothing, the structure decides
    "None": None,
    "meta_schedule.pool_max": "pool",
    "meta_schedule.pool_avg": "pool",
    "meta_schedule.adaptive_pool_max": "pool",
    "meta_schedule.adaptive_pool_avg": "pool",
    "conv2d_NCHWc_int8": "conv2d_int8",
    "conv2d_nchw_winograd_data_pack": None,
    "conv2d_nchw_winograd_inverse": None,
    "conv2d_nhwc_winograd_data_pack": None,
    "conv2d_nhwc_winograd_inverse": None,
}
TOPI_REDUCTIONS = {  # TVM's unannotated computes: the name of a kernel's one reduction block -> kind (longest prefix)
    "conv2d_nchw": "conv2d_nchw",
    "group_conv2d_nchw": "depthwise_nchw",
    "conv2d": "conv2d",
    "matmul": "matmul",
    "T_matmul": "matmul",
    "dense": "matmul",
    "pool": "pool",
    "adaptive_pool": "pool",
}


@tvm_ffi.register_error  # raised inside a pass, it reaches the caller as itself (else a RuntimeError)
class KernelKindError(ValueError):
    """A kernel's annotations name no known kind, or several (a bug in a compute, not in the model)."""


def declare(kind: str) -> dict:
    """The te.compute attrs that declare a kernel kind (checked here, when the compute is built)."""
    if kind not in KINDS:
        raise KernelKindError(f"unknown kernel kind {kind!r}: add it to kinds.KINDS (and a rule to registry.RULES)")
    return {ATTR: kind}


def declared(block) -> str | None:
    """The kind a block's annotations declare (Kiln's, else TOPI's schedule_rule), None where they say nothing."""
    ann = block.annotations
    if ATTR in ann:
        kind = str(ann[ATTR])
        if kind not in KINDS:
            raise KernelKindError(f"block {block.name_hint!r} declares kernel kind {kind!r}, not one of kinds.KINDS")
        return kind
    if TVM_ATTR in ann:
        rule = str(ann[TVM_ATTR])
        if rule not in TVM_RULES:
            raise KernelKindError(
                f"block {block.name_hint!r} has TOPI's schedule_rule {rule!r}, which kinds.TVM_RULES does not map"
            )
        return TVM_RULES[rule]
    return None


def classify(sch: s_tir.Schedule):
    """(kind, anchor block) of a kernel: the kind its blocks declare (the anchor: the declaring
    block; a declared injective block is no anchor), else its structure (by_structure)."""
    bs = blocks(sch)
    decl = [(declared(sch.get(b)), b) for b in bs]
    anchors = [(k, b) for k, b in decl if k is not None and k != "injective"]
    if len({k for k, _ in anchors}) > 1:
        raise KernelKindError(f"one kernel's blocks declare kinds {sorted({k for k, _ in anchors})}")
    if anchors:
        return anchors[0]
    reductions = [b for b in bs if COMM_REDUCE in iter_types(sch, b)]
    if not reductions and any(k == "injective" for k, _ in decl):
        return "injective", None
    return by_structure(sch, bs, reductions)


def by_structure(sch: s_tir.Schedule, bs: list, reductions: list):
    """TVM's computes, which declare nothing: no reduction is injective (or a layout transform),
    several a multi-reduction, one the kind its TOPI name says (TOPI_REDUCTIONS), else a reduction."""
    if not reductions:
        if len(bs) == 1 and sch.get(bs[0]).name_hint.startswith("te_layout_transform"):
            return "layout_transform", bs[0]
        return "injective", None
    if len(reductions) > 1:
        return "multi_reduction", None
    name = sch.get(reductions[0]).name_hint
    prefixes = [p for p in TOPI_REDUCTIONS if name.startswith(p)]
    return (TOPI_REDUCTIONS[max(prefixes, key=len)] if prefixes else "reduction"), reductions[0]


def func_kind(func: tirx.PrimFunc) -> str | None:
    """The kind a PrimFunc's own attribute declares (a kernel with no blocks), else None."""
    if func.attrs is None or ATTR not in func.attrs:
        return None
    kind = str(func.attrs[ATTR])
    if kind not in KINDS:
        raise KernelKindError(f"a PrimFunc declares kernel kind {kind!r}, not one of kinds.KINDS")
    return kind


def kernel_kind(func: tirx.PrimFunc) -> str:
    """The kind of one PrimFunc: its attribute's, else its blocks' (classify)."""
    return func_kind(func) or classify(s_tir.Schedule(func))[0]


def strip(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The kernel without Kiln's kind annotations: the computation MetaSchedule's database keys on."""
    if not isinstance(func.body, s_tir.SBlockRealize):  # no blocks (a C kernel's caller): nothing to strip
        return func
    sch = s_tir.Schedule(func)
    # the root block by its own name: TOPI's extern kernels (NMS, sort) name it after the op, not "root"
    todo, found = [sch.get_sblock(func.body.block.name_hint)], False
    while todo:
        for b in sch.get_child_blocks(todo.pop()):
            if ATTR in sch.get(b).annotations:
                sch.unannotate(b, ATTR)
                found = True
            todo.append(b)
    return sch.mod["main"] if found else func


def strip_module(mod: tvm.IRModule) -> tvm.IRModule:
    """A workload module (MetaSchedule's: {"main": kernel}) with its kernels stripped."""
    return tvm.IRModule(
        {gv: strip(f) if isinstance(f, tirx.PrimFunc) else f for gv, f in mod.functions.items()}, attrs=mod.attrs
    )
