"""The manifest's `kernel_info`: static facts about every compiled kernel, computed at compile time
because the runtime never imports the compiler. For each PrimFunc the entry function calls: the
ONNX nodes it came from, its calls per run, FLOPs (TVM's estimate), bytes read and written (its
arguments and outputs), and its schedule (tuned record, Kiln's default rule, a C kernel, or none:
TVM's plain lowering). `kiln profile` / `kiln bench --profile` join these with measured times.

Source nodes: TVM 0.27's ONNX importer sets no spans or names on what it emits, and Kiln's passes
rebuild calls, so the names are recovered by matching. The compute ops (convolutions, matmuls,
pools, softmax) mostly keep their relative order through the pipeline, so the k-th conv kernel gets
the k-th Conv node (a fused depthwise+pointwise kernel two). Mostly: a residual block's projection
shortcut may be called before the block's last conv, so a conv kernel takes, among the next few
queued Conv nodes, the first whose weight has as many elements as one of the kernel's arguments (a
Winograd kernel's transformed weight 16/9 or 36/9 as many, an RGB stem's as SpaceToDepthStem packs it), else the
next one. The element-wise nodes that follow one of them (bias, BatchNorm, activation, residual Add) go with it
when the kernel's name shows them fused; a kernel with no compute op takes the next unclaimed node whose op
its name shows. Layout transforms come from no node. Best effort: a kernel the matching cannot place lists no ops."""

from __future__ import annotations

import math
import re

import onnx
import tvm
from tvm import relax, s_tir

from .ir import nbytes, numel
from .passes import space_to_depth_stem as stem

# kernel-name fragment -> the group of ONNX compute ops it stands for (checked in this order)
ANCHORS = (
    ("dwpw_conv2d", "conv", 2),
    ("conv_transpose", "convT", 1),
    ("conv2d_transpose", "convT", 1),
    ("conv1d_transpose", "convT", 1),
    ("conv", "conv", 1),
    ("matmul", "matmul", 1),
    ("dense", "matmul", 1),
    ("max_pool", "maxpool", 1),
    ("avg_pool", "avgpool", 1),
    ("mean", "avgpool", 1),
    ("softmax", "softmax", 1),
    ("recurrence", "recurrence", 1),
)
GROUPS = {
    "Conv": "conv",
    "ConvInteger": "conv",
    "QLinearConv": "conv",
    "ConvTranspose": "convT",
    "MatMul": "matmul",
    "Gemm": "matmul",
    "MatMulInteger": "matmul",
    "QLinearMatMul": "matmul",
    "MaxPool": "maxpool",
    "GlobalMaxPool": "maxpool",
    "AveragePool": "avgpool",
    "GlobalAveragePool": "avgpool",
    "ReduceMean": "avgpool",
    "Softmax": "softmax",
    "KilnRecurrence": "recurrence",  # an LSTM/GRU/RNN layer as one kernel (frontends/tvm_recurrence.py)
    "LogSoftmax": "softmax",
}
# ONNX op -> the words its lowering leaves in a fused kernel's name (default: the op's name in lower case)
TOKENS = {
    "Relu": ("relu",),
    "Add": ("add",),
    "Sum": ("add",),
    "Sub": ("subtract",),
    "Mul": ("multiply",),
    "Div": ("divide",),
    "Clip": ("clip", "relu", "minimum", "maximum"),
    "Sigmoid": ("sigmoid",),
    "Tanh": ("tanh",),
    "LeakyRelu": ("leakyrelu", "leaky_relu"),
    "HardSwish": ("hardswish", "sigmoid", "multiply", "clip"),
    "HardSigmoid": ("clip", "hardsigmoid"),
    "Flatten": ("reshape",),
    "Reshape": ("reshape",),
    "Squeeze": ("reshape", "squeeze"),
    "Unsqueeze": ("reshape", "expand_dims"),
    "Transpose": ("transpose", "permute_dims"),
    "Concat": ("concat", "concatenate"),
    "Pow": ("power",),
    "Sqrt": ("sqrt",),
    "Exp": ("exp",),
    "Erf": ("erf",),
    "Gelu": ("gelu", "erf"),
    "ReduceSum": ("sum",),
    "ReduceMax": ("max",),
    "Resize": ("resize", "image"),
}
FOLDED = {"BatchNormalization", "Identity", "Dropout"}  # folded into the op before them: no kernel of their own


def for_manifest(mod: tvm.IRModule, onnx_model=None, precision: str = "fp32", caps=None) -> dict:
    """kernel_info for the artifact's manifest, with each kernel's precision and unit on a CPU target (caps);
    {} (no profile facts, never a failed compile) when the module is not one it can read (e.g. an
    accelerator flow's)."""
    try:
        info = kernel_info(mod, onnx_model)
    except Exception:
        return {}
    if getattr(caps, "isa", None) is not None:  # a CPU's capabilities
        from .precision_units import kernel_precision

        for name, v in info.items():
            v.update(kernel_precision(mod[name], v["kind"], bool(v.get("int8")), precision, caps))
    return info


def kernel_info(mod: tvm.IRModule, onnx_model=None, func: str = "main") -> dict:
    """name -> {ops, calls, flops, bytes_read, bytes_written, schedule} for every PrimFunc `func`
    calls; flops and bytes are per call. onnx_model: the (simplified) model that was imported."""
    from ..schedules.rules.apply import estimated_flops

    info: dict = {}
    order, sizes = [], []
    for name, args, out in _call_sites(mod, func):
        order.append(name)
        sizes.append({numel(a) for a in args})
        if name in info:
            info[name]["calls"] += 1
            continue
        info[name] = {
            "ops": [],
            "calls": 1,
            "flops": int(estimated_flops(mod[name])),
            "bytes_read": sum(nbytes(a) for a in args),
            "bytes_written": nbytes(out),
        }
    for name, v in info.items():
        v["schedule"] = schedule_kind(mod[name])
        v["kind"] = _kind(mod[name])
        if _integer(mod[name]):
            v["int8"] = True
    if onnx_model is not None:
        for name, ops in source_ops(order, onnx_model, sizes).items():
            info[name]["ops"] = ops
    return info


INT8_KINDS = frozenset({"conv2d_int8", "conv2d_amx", "matmul_int8"})


def _kind(f) -> str | None:
    """The kernel's kind (schedules/rules/kinds.py), None for a kernel with no blocks to classify (TOPI's NMS, sort)."""
    from ..schedules.rules.kinds import kernel_kind

    try:
        return kernel_kind(f)
    except s_tir.ScheduleError:
        return None


def _integer(f) -> bool:
    """Whether the kernel's main computation is an int8 dot product (a block declares an int8 kind): its
    operations per second are not comparable with the float32 FMA peak the profile shows."""
    from tvm import s_tir

    if not isinstance(f.body, s_tir.SBlockRealize):  # no blocks (a C kernel's caller)
        return False
    sch = s_tir.Schedule(f)

    def declares(block) -> bool:
        if str(sch.get(block).annotations.get("kiln.kernel_kind", "")) in INT8_KINDS:
            return True
        return any(declares(c) for c in sch.get_child_blocks(block))

    # the root block by its own name: TOPI's extern kernels (scatter, NMS) name it after the op, not "root"
    return declares(sch.get_sblock(f.body.block.name_hint))


def schedule_kind(f) -> str:
    """c-kernel (Kiln's hand-written C: its kind comes scheduled), tuned (a database record that beat
    the default schedule: ApplyTuningDatabase marks it), default (Kiln's rule), none (TVM's plain lowering)."""
    from ..schedules.rules.apply import TUNED_ATTR, is_scheduled
    from ..schedules.rules.kinds import SCHEDULED, func_kind

    if func_kind(f) in SCHEDULED:
        return "c-kernel"
    if not is_scheduled(f):
        return "none"
    return "tuned" if f.attrs is not None and TUNED_ATTR in f.attrs else "default"


def _call_sites(mod, func: str):
    """(PrimFunc name, argument types, output type) of each call_tir of `func`, in order."""
    for block in mod[func].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.call_tir":
                args = v.args[1].fields if isinstance(v.args[1], relax.Tuple) else [v.args[1]]
                yield str(v.args[0].name_hint), [a.ty for a in args], b.var.ty


def _weight_numels(nodes, onnx_model) -> dict:
    """id(Conv node) -> the element counts its weight can have in a kernel's arguments (as given,
    and Winograd-transformed: 16/9 and 36/9 of a 3x3 kernel's); the weight read through a
    DequantizeLinear too. Nodes whose weight is not a constant are left out."""
    dims = {t.name: list(t.dims) for t in onnx_model.graph.initializer}
    for n in nodes:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            dims[n.output[0]] = list(n.attribute[0].t.dims)
        elif n.op_type == "DequantizeLinear" and n.input and n.input[0] in dims:
            dims[n.output[0]] = dims[n.input[0]]
    out = {}
    for n in nodes:
        if GROUPS.get(n.op_type) == "conv" and n.op_type != "QLinearConv" and len(n.input) > 1:
            d = dims.get(n.input[1])
            if d and len(d) == 4:
                total = math.prod(d)
                out[id(n)] = {total} | ({total * 16 // 9, total * 36 // 9} if d[2:] == [3, 3] else set())
                out[id(n)] |= _space_to_depth_numels(n, d)
    return out


def _space_to_depth_numels(node, dims: list) -> set:
    """The weight sizes a stem conv has after SpaceToDepthStem (2x2 blocks of its input pixels, channels padded to
    the block, a kernel of ceil(K/2) taps a side): without them the stem matched no kernel by size and took, by
    coincidence of sizes, ResNet-50's fourth conv's place (the profile then named every stage-1 kernel wrong)."""
    strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [1, 1])
    o, c, kh, kw = dims
    return {math.prod(stem.blocked_shape(o, kh, kw))} if stem.rearranged(c, strides, [kh, kw]) else set()


LOOKAHEAD = 4  # how far down the Conv queue a kernel's weight is looked for


def _take(queue: list, count: int, sizes: set, weights: dict) -> tuple[list, list]:
    """The anchors a kernel takes from its group's queue: the next `count`, or for a single conv the
    first of the next LOOKAHEAD whose weight size is among the kernel's argument sizes."""
    if count == 1 and sizes:
        for i, n in enumerate(queue[:LOOKAHEAD]):
            if weights.get(id(n), set()) & sizes:
                return [n], queue[:i] + queue[i + 1 :]
    return queue[:count], queue[count:]


def _words(name: str) -> set[str]:
    return set(re.split(r"[_\d]+", name.lower())) | {name.lower()}


def source_ops(kernels: list[str], onnx_model, sizes: list[set] | None = None) -> dict[str, list[str]]:
    """kernel name -> the ONNX node names it came from (see the module docstring). kernels: one
    entry per call, in call order (a kernel called twice takes two nodes' worth); sizes: per call,
    the element counts of its arguments (used to place conv kernels; None: call order alone)."""
    nodes = list(onnx_model.graph.node)
    weights = _weight_numels(nodes, onnx_model)
    label = {id(n): n.name or f"{n.op_type}_{i}" for i, n in enumerate(nodes)}
    producer = {o: n for n in nodes for o in n.output}
    consumers: dict = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    owner: dict = {}  # id(element-wise node) -> the compute node it follows
    for n in nodes:
        if n.op_type in GROUPS:
            continue
        for i in n.input:
            p = producer.get(i)
            if p is None:
                continue
            root = p if p.op_type in GROUPS else owner.get(id(p))
            if root is not None and len(consumers.get(i, ())) == 1:
                owner[id(n)] = root
            break  # the first tensor input decides
    queues: dict = {}
    for n in nodes:
        if n.op_type in GROUPS:
            queues.setdefault(GROUPS[n.op_type], []).append(n)
    followers: dict = {}
    for n in nodes:
        if id(n) in owner:
            followers.setdefault(id(owner[id(n)]), []).append(n)
    claimed: set = set()
    out: dict = {}
    for j, k in enumerate(kernels):
        low, words = k.lower(), _words(k)
        if "layout_transform" in low:
            out.setdefault(k, [])
            continue
        anchors = []
        for frag, group, count in ANCHORS:
            if frag in low:
                held = sizes[j] - {0} if sizes is not None and group == "conv" else set()
                anchors, queues[group] = _take(queues.get(group, []), count, held, weights)
                break
        ops = []
        for i, a in enumerate(anchors):  # between two anchors of one kernel (dw -> act -> pw): all inside it
            ops.append(a)
            ops.extend(
                f
                for f in followers.get(id(a), [])
                if i < len(anchors) - 1 or f.op_type in FOLDED or words & set(_tokens(f.op_type))
            )
        if not anchors:  # an element-wise or data-movement kernel: the next unclaimed node its name shows
            ops = [
                next(
                    (
                        n
                        for n in nodes
                        if id(n) not in claimed and n.op_type not in GROUPS and words & set(_tokens(n.op_type))
                    ),
                    None,
                )
            ]
            ops = [n for n in ops if n is not None]
        claimed.update(id(n) for n in ops)
        out.setdefault(k, []).extend(label[id(n)] for n in ops)
    return out


def _tokens(op_type: str) -> tuple:
    return TOKENS.get(op_type, (op_type.lower(),))
