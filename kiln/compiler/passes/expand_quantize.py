"""ExpandQuantize: a per-tensor quantize in a QDQ model's conv epilogue, written as the float ops it stands for so
that they join their neighbours. Two cases, both from onnxruntime's quantize_static of a net whose BatchNorms were
not folded (conv -> Q -> DQ -> BatchNorm -> Q; every conv of its ResNet-50 ends so):
- the value is already on the quantize's grid, clip(round(x), lo, hi) * s quantized with the same scale s (what
  FoldQDQPairs leaves of a Q -> DQ pair): a cast of clip(round(x), lo, hi) + zp. (n * s) / s rounds back to n for
  every n a byte holds, so the quantize's multiply, rounding and clip change nothing: exact.
- any other: round(x * (1 / s)) + zp clipped and cast, the ops Kiln legalizes a quantize to (kiln/compiler/
  legalize.py), so that FoldAffineChains folds the 1 / s into a run of multiplies and adds before it (the BatchNorm
  after a Q -> DQ pair).
It runs after FuseEpilogue, whose patterns end a float conv's kernel with a whole quantize.
`stats["quantizes_on_grid"]`, `stats["quantizes_expanded"]`."""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ...counters import Counter
from ..ir import clip_bounds, op_name, scalar_value
from .fold_qdq_pairs import RANGES
from .module_map import block_like, rewrite_blocks


def _grid(defs: dict, g) -> tuple[float, float] | None:
    """The integer bounds of g = clip(round(x), lo, hi), else None."""
    clip = defs.get(g)
    bounds = clip_bounds(clip)
    if bounds is None or not all(math.isfinite(v) and v == int(v) for v in bounds):
        return None
    if not isinstance(clip.args[0], relax.Var) or op_name(defs.get(clip.args[0])) != "relax.round":
        return None
    return bounds


def _on_grid(defs: dict, x, s: float, zp: float, dtype: str):
    """g where x = g * s, g on the integer grid with g + zp inside the output type's range; else None."""
    m = defs.get(x)
    if op_name(m) != "relax.multiply" or not isinstance(m.args[0], relax.Var) or scalar_value(m.args[1]) is None:
        return None
    g = m.args[0]
    bounds = _grid(defs, g)
    if bounds is None or np.float32(scalar_value(m.args[1])) != np.float32(s) or str(g.ty.dtype) != "float32":
        return None
    lo, hi = RANGES[dtype]
    return g if lo <= bounds[0] + zp and bounds[1] + zp <= hi else None


def _expanded(defs: dict, value, stats):
    """The float ops for `value` where it is a quantize ExpandQuantize rewrites, else None."""
    if op_name(value) != "relax.quantize" or not isinstance(value.args[0], relax.Var):
        return None
    x = value.args[0]
    dtype, s, zp = str(value.attrs.out_dtype), scalar_value(value.args[1]), scalar_value(value.args[2])
    if dtype not in RANGES or s is None or zp is None or str(x.ty.dtype) != "float32":
        return None
    g = _on_grid(defs, x, s, zp, dtype)
    if g is not None:
        stats["quantizes_on_grid"] += 1
        return relax.op.astype(g if zp == 0 else relax.op.add(g, relax.const(np.float32(zp))), dtype)
    stats["quantizes_expanded"] += 1
    r = relax.op.round(relax.op.multiply(x, relax.const(np.float32(1.0) / np.float32(s))))
    r = r if zp == 0 else relax.op.add(r, relax.const(np.float32(zp)))
    return relax.op.astype(relax.op.clip(r, *RANGES[dtype]), dtype)


def _fold_block(block, stats):
    bindings = list(block.bindings)
    defs = {b.var: b.value for b in bindings}
    out = []
    for b in bindings:
        e = _expanded(defs, b.value, stats)
        out.append(b if e is None else relax.VarBinding(b.var, e))
    return block_like(block, out)


# what ExpandQuantize counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("quantizes_on_grid", int, "quantizes of values already on their grid computed as casts"),
    Counter("quantizes_expanded", int, "quantizes written as float ops to fold with the ops before them"),
)


@tvm.transform.module_pass(opt_level=1, name="ExpandQuantize")
class ExpandQuantize:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"quantizes_on_grid": 0, "quantizes_expanded": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out = rewrite_blocks(mod, lambda blk: _fold_block(blk, self.stats))
        if not any(self.stats.values()):
            return mod
        return relax.transform.DeadCodeElimination(["main"])(relax.transform.Normalize()(out))
