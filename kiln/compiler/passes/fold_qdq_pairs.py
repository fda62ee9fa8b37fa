"""FoldQDQPairs: a quantize whose only reader is a dequantize of the same scale and zero point (a QDQ model's fake
quantization between two float ops: onnxruntime's quantize_static of a net whose BatchNorms were not folded writes
conv -> Q -> DQ -> BatchNorm -> Q -> DQ) becomes the rounding it stands for, in float:
    DQ(Q(x)) = (clip(round(x / s) + zp, lo, hi) - zp) * s ~ clip(round(x * (1 / s)), lo - zp, hi - zp) * s
without the 8-bit round trip (a cast to uint8 and back per element) and the division (vdivps: a zmm every 10-16
cycles, two a pair in ResNet-50's conv epilogues) that LowerQDQ left in the conv epilogue. Integers are exact in
float32; x * (1 / s) may differ from x / s in its last bit, which moves a value lying exactly on a rounding
boundary by one step (as Kiln's own quantizer, which multiplies too). Per-tensor scale and zero point only.
`stats["qdq_pairs_folded"]`."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ...counters import Counter
from ..ir import op_name, scalar_value, var_users
from .module_map import block_like, rewrite_blocks

RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def _pair(defs: dict, users: dict, value):
    """(x, scale, zero point, dtype) where `value` dequantizes a single-use quantize of x with the same per-tensor
    parameters, else None."""
    if op_name(value) != "relax.dequantize" or not isinstance(value.args[0], relax.Var):
        return None
    q = defs.get(value.args[0])
    if op_name(q) != "relax.quantize" or len(users.get(value.args[0], [])) != 1:
        return None
    dtype = str(q.attrs.out_dtype)
    s, z = scalar_value(q.args[1]), scalar_value(q.args[2])
    if dtype not in RANGES or s is None or z is None or str(value.attrs.out_dtype) != "float32":
        return None
    if scalar_value(value.args[1]) != s or scalar_value(value.args[2]) != z or str(q.args[0].ty.dtype) != "float32":
        return None
    return q.args[0], s, z, dtype


def _fold_block(block, stats):
    bindings = list(block.bindings)
    defs = {b.var: b.value for b in bindings}
    users = var_users(bindings)
    out = []
    for b in bindings:
        got = _pair(defs, users, b.value)
        if got is None:
            out.append(b)
            continue
        x, s, z, dtype = got
        lo, hi = RANGES[dtype]
        r = relax.op.round(relax.op.multiply(x, relax.const(np.float32(1.0) / np.float32(s))))
        out.append(
            relax.VarBinding(b.var, relax.op.multiply(relax.op.clip(r, lo - z, hi - z), relax.const(np.float32(s))))
        )
        stats["qdq_pairs_folded"] += 1
    return block_like(block, out)


# what FoldQDQPairs counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("qdq_pairs_folded", int, "quantize -> dequantize pairs between float ops computed as one rounding"),
)


@tvm.transform.module_pass(opt_level=1, name="FoldQDQPairs")
class FoldQDQPairs:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"qdq_pairs_folded": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out = rewrite_blocks(mod, lambda blk: _fold_block(blk, self.stats))
        return relax.transform.DeadCodeElimination(["main"])(out) if self.stats["qdq_pairs_folded"] else mod
