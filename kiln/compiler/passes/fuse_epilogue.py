"""FuseEpilogue: conv2d / conv2d_transpose / matmul + bias + activation + residual add (+ a final
activation) (+ a cast, e.g. to bf16 for the vdpbf16ps conv that reads it: the kernel writes the
reduced type once instead of float32 that a cast kernel reads back; outputs bit-identical, timings
in benchmarks/history.md) become one kernel. The pattern table below is the whole policy: each entry is a chain
of optional stages; FuseOpsByPattern groups each match into a primitive function that LegalizeOps
and FuseTIR turn into a single kernel. Activations: ReLU, Clip/ReLU6 (max/min), Sigmoid, SiLU,
GELU (op, tanh and erf forms), HardSwish. A per-tensor quantize may end any chain: a QDQ model's float
depthwise conv then writes the next int8 layer's uint8 itself."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import is_call_tir, is_const, is_op, wildcard

from ...counters import Counter
from .fuse_depthwise_pointwise import PRIMFUNC as DWPW
from .pack_dense_weights import PRIMFUNC as PACKED_MATMUL
from .winograd import PRIMFUNC, REDUCED

ANCHORS = ("relax.nn.conv2d", "relax.nn.conv2d_transpose", "relax.matmul")


def _activations(y):
    """Every activation form the importer emits, applied to y, as one alternation."""
    mx = is_op("relax.maximum")(y, is_const())
    relu6 = is_op("relax.minimum")(mx, is_const()) | is_op("relax.clip")(y, wildcard(), wildcard())
    silu = is_op("relax.multiply")(y, is_op("relax.sigmoid")(y)) | is_op("relax.nn.silu")(y)
    erf_gelu = is_op("relax.multiply")(
        is_op("relax.multiply")(
            y, is_op("relax.add")(is_op("relax.erf")(is_op("relax.divide")(y, is_const())), is_const())
        ),
        is_const(),
    )
    hswish = is_op("relax.multiply")(
        y,
        is_op("relax.divide")(
            is_op("relax.clip")(is_op("relax.add")(y, is_const()), wildcard(), wildcard()), is_const()
        ),
    )
    return (
        is_op("relax.nn.relu")(y)
        | relu6
        | mx
        | is_op("relax.sigmoid")(y)
        | silu
        | is_op("relax.nn.gelu")(y)
        | is_op("relax.nn.gelu_tanh")(y)
        | erf_gelu
        | hswish
    )


def _no_leaks(ctx) -> bool:
    """Reject a match whose intermediate values are also used outside it (fusing would lose them)."""
    return not has_leaking_intermediate_variables(ctx)


def epilogue_patterns() -> list[tuple]:
    """(name, pattern, {}, check), longest chains first: anchor -> [bias] -> [act] -> [residual add -> [act]] -> [cast].
    The residual add's operand order gets its own entries so a rejected order can fall back to the other."""
    anchor = (
        is_op(ANCHORS[0])(wildcard(), wildcard())
        | is_op(ANCHORS[1])(wildcard(), wildcard())
        | is_op(ANCHORS[2])(wildcard(), wildcard())
        | is_call_tir(PRIMFUNC)
        | is_call_tir(PACKED_MATMUL)
        | is_call_tir(DWPW)
    )  # Kiln's graph-level kernels
    bias = is_op("relax.add")(anchor, is_const())
    head = bias | anchor
    act = _activations(head)
    pre = act | head
    # the residual is not a constant: a bias add matched as a residual took the residual's producer in the pass of
    # the first order, before the second order could take the real residual add after it (MobileNetV2: the first
    # residual add of each stage ran as a kernel of its own)
    other = ~is_const()
    res_l, res_r = is_op("relax.add")(pre, other), is_op("relax.add")(other, pre)
    table = [
        ("kiln.epilogue_res_act", _activations(res_l)),
        ("kiln.epilogue_res_act", _activations(res_r)),
        ("kiln.epilogue_res", res_l),
        ("kiln.epilogue_res", res_r),
        ("kiln.epilogue_act", act),
        ("kiln.epilogue_bias", bias),
    ]
    casts = [(f"{name}_cast", is_op("relax.astype")(pat)) for name, pat in table] + [
        ("kiln.epilogue_cast", is_op("relax.astype")(anchor))
    ]
    quantized = [(f"{name}_quantize", is_op("relax.quantize")(pat, is_const(), is_const())) for name, pat in table]
    return (
        [(name, pat, {}, _float_narrowing) for name, pat in casts]
        + [(name, pat, {}, _per_tensor_quantize) for name, pat in quantized]
        + [(name, pat, {}, _no_leaks) for name, pat in table]
    )


def _per_tensor_quantize(ctx) -> bool:
    """A float conv's result quantized for the int8 layer after it (a QDQ model's float depthwise conv): the
    kernel writes uint8/int8 once instead of float32 that a quantize kernel reads back."""
    q = ctx.matched_expr
    return _no_leaks(ctx) and all(a.value.numpy().size == 1 for a in q.args[1:3])


def _float_narrowing(ctx) -> bool:
    """A float32 result cast to a reduced float type (what a bf16/fp16 conv reads), nothing leaking;
    other casts (an int8 conv's int32 to float32) keep the fusion they had."""
    cast = ctx.matched_expr
    return _no_leaks(ctx) and str(cast.args[0].ty.dtype) == "float32" and str(cast.ty.dtype) in REDUCED


# what FuseEpilogue counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("epilogues_fused", int, "epilogues fused into their producer", always=True),)


@tvm.transform.module_pass(opt_level=2, name="FuseEpilogue")
class FuseEpilogue:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"epilogues_fused": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        mod = relax.transform.FuseOpsByPattern(epilogue_patterns(), bind_constants=False)(mod)
        composite = {
            gv for gv, f in mod.functions.items() if isinstance(f, relax.Function) and "Composite" in (f.attrs or {})
        }
        calls = []
        relax.analysis.post_order_visit(
            mod["main"].body, lambda e: calls.append(e) if isinstance(e, relax.Call) and e.op in composite else None
        )
        self.stats["epilogues_fused"] = len(calls)
        return mod
