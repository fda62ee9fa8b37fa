"""Int8Residuals: an int8 CNN's residual stream read as the uint8 codes the next conv already reads. In an int8
ResNet the block output feeds the next block's first conv as uint8 (quantized in the producer's epilogue) and the
next residual add in float32, so its kernel wrote it twice (4 + 1 bytes an element) and the add read 4 bytes back.
Here a residual add whose operand r is also quantized for an int8 layer, `add(x, r)` with `q = quantize(r)`,
reads `dequantize(q)` instead: the producer then writes uint8 alone, as in onnxruntime's QDQ ResNets, whose
residual adds read DQ(Q(r)). Only adds of conv maps (4-D or 5-D) whose other
operand comes from an int8 conv: a transformer's residual stream, with its outliers, stays float32.
`stats["int8_residuals"]` counts the adds."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ...counters import Counter
from ..ir import op_name, var_users
from ..quantize.rewrite import quantize_act_chain
from .module_map import block_like, rewrite_blocks, var_like

CHAIN_DEPTH = 6  # ops between an int8 conv and the add: cast, scale, zero-point correction, bias, residual, ReLU
THROUGH = ("relax.add", "relax.subtract", "relax.multiply", "relax.astype", "relax.nn.relu", "relax.clip")


def _int8_conv_fed(defs: dict, var, depth: int = CHAIN_DEPTH) -> bool:
    """`var` is an integer conv's output (int32 accumulators), through its requantizing epilogue."""
    value = defs.get(var)
    if value is None or depth < 0:
        return False
    if op_name(value) == "relax.nn.conv2d":
        return str(value.ty.dtype) == "int32"
    if op_name(value) not in THROUGH:
        return False
    return any(isinstance(a, relax.Var) and _int8_conv_fed(defs, a, depth - 1) for a in value.args)


def _quantized(bindings, users: dict, r, before: int):
    """(q, scale, zero point) where bindings before index `before` quantize r to uint8 codes q (QuantizeGraph's
    quantize_act), else None."""
    for i in users.get(r, []):
        got = quantize_act_chain(bindings, users, i) if i < before else None
        if got is not None and got[0][-1] < before:
            return bindings[got[0][-1]].var, got[1], got[2]
    return None


def _dequantized(q, scale: float, zp: float, var):
    """Bindings computing (float(q) - zp) * scale (one relax.dequantize), and the var holding it: FuseOps fuses it
    into the consuming conv's kernel once CanonicalizeAliases has dropped the layout passes' aliases."""
    d = var(f"{q.name}_dq", relax.TensorType(q.ty.shape, "float32"))
    op = relax.op.dequantize(q, relax.const(np.float32(scale)), relax.const(np.uint8(zp)), out_dtype="float32")
    return [relax.VarBinding(d, op)], d


def _residual_block(block, stats):
    bindings = list(block.bindings)
    defs = {b.var: b.value for b in bindings}
    users = var_users(bindings)
    var = var_like(block)
    out = []
    for i, b in enumerate(bindings):
        v = b.value
        pair = v.args if op_name(v) == "relax.add" and len(v.args) == 2 else ()
        if not (
            pair
            and all(isinstance(a, relax.Var) for a in pair)
            and not pair[0].same_as(pair[1])
            and all(str(a.ty.dtype) == "float32" and a.ty.ndim in (4, 5) for a in pair)
        ):
            out.append(b)
            continue
        got = None
        for r, x in (pair, pair[::-1]):
            q = _quantized(bindings, users, r, i) if _int8_conv_fed(defs, x) else None
            if q is not None:
                got = (x, *q)
                break
        if got is None:
            out.append(b)
            continue
        x, q, scale, zp = got
        deq, d = _dequantized(q, scale, zp, var)
        at = next(k for k, o in enumerate(out) if o.var.same_as(q)) + 1  # beside the codes, as in a QDQ model
        out[at:at] = deq
        out.append(relax.VarBinding(b.var, relax.op.add(x, d)))
        stats["int8_residuals"] += 1
    return block_like(block, out)


# what Int8Residuals counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("int8_residuals", int, "residual adds of int8 convs that read their residual as uint8 codes"),
)


@tvm.transform.module_pass(opt_level=2, name="Int8Residuals")
class Int8Residuals:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"int8_residuals": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out = rewrite_blocks(mod, lambda blk: _residual_block(blk, self.stats))
        return relax.transform.DeadCodeElimination(["main"])(out) if self.stats["int8_residuals"] else mod
