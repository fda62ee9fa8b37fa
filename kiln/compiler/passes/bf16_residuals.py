"""BF16Residuals: a bf16 build's residual stream in bf16. In a ResNet block the sum that leaves it feeds the next
block's first conv (in bf16) and the next residual add (in float32), so its conv kernel wrote it twice, and each
residual add read a float32 tensor back: twice the bytes of a bf16 stream, and ResNet-50's 1x1 convs that add the
residual ran at half the speed of those that do not (benchmarks/history.md). Here the residual operand of an add
of two bf16 conv kernels' chains (BF16ConvKernel's calls, through + bias, + residual, ReLU) is rounded to bf16:
`add(x, r)` becomes `add(x, astype(r16, float32))`, with r16 the bf16 cast of r that the graph already has (the
block output's cast for the next conv), else a new one. FuseBF16Epilogue then fuses the cast into r's kernel
(which now writes bf16 only) and reads the residual in bf16 (EP_RES16). As OpenVINO's bf16, whose whole graph is
bf16, the residuals are rounded to bf16's 8 significant bits; the report's accuracy against float32 shows it.
`stats["bf16_residuals"]` counts the rounded adds."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter
from ..ir import op_name
from .bf16_conv_kernel import ConvGeometry, conv_dtype
from .epilogue_outputs import called_primfunc, tensor_type
from .module_map import block_like, rewrite_blocks, var_like

CHAIN_DEPTH = 4  # ops between a kernel call and the add: + bias, + residual, ReLU, and one to spare


def _kernel_fed(mod, defs: dict, var, depth: int = CHAIN_DEPTH) -> bool:
    """`var` is a bf16 conv kernel's output, through adds and clamps (its chain for FuseBF16Epilogue)."""
    value = defs.get(var)
    if value is None or depth < 0:
        return False
    func = called_primfunc(mod, value)
    if func is not None:
        return ConvGeometry.of(func.attrs) is not None and conv_dtype(func.attrs) == "bfloat16"
    if op_name(value) not in ("relax.add", "relax.nn.relu", "relax.clip"):
        return False
    args = value.args[:2] if op_name(value) == "relax.add" else value.args[:1]
    return any(isinstance(a, relax.Var) and _kernel_fed(mod, defs, a, depth - 1) for a in args)


def _bf16_cast_of(bindings, var):
    """The var of a cast of `var` to bf16 among `bindings` (those before the add), else None."""
    for b in bindings:
        v = b.value
        if op_name(v) == "relax.astype" and str(v.attrs.dtype) == "bfloat16" and v.args[0].same_as(var):
            return b.var
    return None


def _residual(mod, defs: dict, value):
    """The operand of a residual add of two bf16 conv chains to round: the one already cast to bf16, else the first;
    None where the add is not one."""
    if op_name(value) != "relax.add" or len(value.args) != 2:
        return None
    a, b = value.args
    if not all(isinstance(v, relax.Var) for v in (a, b)) or a.same_as(b):
        return None
    ta, tb = tensor_type(a), tensor_type(b)
    if ta is None or ta != tb or ta[1] != "float32" or len(ta[0]) != 5:
        return None
    if not (_kernel_fed(mod, defs, a) and _kernel_fed(mod, defs, b)):
        return None
    return a, b


def _round_block(mod, block, stats):
    bindings = list(block.bindings)
    defs = {b.var: b.value for b in bindings}
    var = var_like(block)
    out = []
    for i, b in enumerate(bindings):
        pair = _residual(mod, defs, b.value)
        if pair is None:
            out.append(b)
            continue
        cast = {v: _bf16_cast_of(bindings[:i], v) for v in pair}
        r = next((v for v in pair if cast[v] is not None), pair[0])
        r16 = cast[r]
        if r16 is None:
            r16 = var(f"{r.name}_bf16", relax.TensorType(r.ty.shape, "bfloat16"))
            out.append(relax.VarBinding(r16, relax.op.astype(r, "bfloat16")))
        widened = var(f"{r.name}_res", relax.TensorType(r.ty.shape, "float32"))
        out.append(relax.VarBinding(widened, relax.op.astype(r16, "float32")))
        x = pair[1] if r.same_as(pair[0]) else pair[0]
        out.append(relax.VarBinding(b.var, relax.op.add(x, widened)))
        stats["bf16_residuals"] += 1
    return block_like(block, out)


# what BF16Residuals counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("bf16_residuals", int, "residual adds of bf16 conv kernels that read their residual in bf16"),
)


@tvm.transform.module_pass(opt_level=2, name="BF16Residuals")
class BF16Residuals:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"bf16_residuals": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out = rewrite_blocks(mod, lambda blk: _round_block(mod, blk, self.stats))
        return out if self.stats["bf16_residuals"] else mod
