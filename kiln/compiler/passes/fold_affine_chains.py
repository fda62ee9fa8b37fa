"""FoldAffineChains: a run of float32 multiplies and adds by constants, each value read by the next alone, becomes
one multiply and one add (x * A + B, a single FMA in the kernel it fuses into), the constants composed at compile
time. A QDQ model's conv epilogue has such runs between its roundings: onnxruntime's quantize_static of a net whose
BatchNorms were not folded writes conv -> Q -> DQ -> BatchNorm -> Q, and after LowerQDQ and FoldQDQPairs each conv
kernel multiplied by the weight scales, added the zero point's correction, multiplied by 1 / s, rounded, multiplied
by s, by the BatchNorm's scale, added its bias and multiplied by the next 1 / s (ExpandQuantize's): seven vector ops
an output element in a kernel whose tile products take a fraction of its time, now two FMAs (ResNet-50's QDQ file
7.18 -> 6.60 ms on AMX with ExpandQuantize; benchmarks/history.md). OpenVINO fuses
such runs the same way (its MultiplyMultiplyFusion, AddMultiplyFusion). (x * a) * b may differ from x * (a * b) in
its last bit, which moves a value lying exactly on a later rounding boundary by one step, as FoldQDQPairs' and Kiln's
own quantizer's products do. `stats["affine_chains_folded"]`."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import op_name, var_users
from .counting import static_shape
from .module_map import block_like, rewrite_blocks

OPS = ("relax.multiply", "relax.add", "relax.subtract", "relax.divide")
# constants, given and composed, this far from 1 (or zero) only: a run that scales by powers of two near the float
# range's ends (BitCast's decomposition, 2**126 twice) means its intermediate range, and x * (a * b) would overflow
# or flush what x * a * b keeps (quantization scales and BatchNorm factors sit well inside)
MAGNITUDE = 2.0**64


def _step(value):
    """(x, op, constant) where `value` is a float32 multiply, add, subtract or divide of a Var x by a constant that
    does not broadcast x to a larger shape (the constant second for subtract and divide), else None. A divide is a
    multiply by the reciprocal (vdivps: a zmm every 10-16 cycles; an erf GELU's x / sqrt(2) was half of its
    kernel's time), which may differ from the quotient in its last bit."""
    op = op_name(value)
    if op not in OPS or str(getattr(value.ty, "dtype", "")) != "float32":
        return None
    a, b = value.args
    if isinstance(a, GenericConst) and op in ("relax.multiply", "relax.add"):
        a, b = b, a
    if not isinstance(a, relax.Var) or not isinstance(b, GenericConst) or str(b.ty.dtype) != "float32":
        return None
    shape = static_shape(value)
    if shape is None or shape != static_shape(a) or b.value.numpy().ndim > len(shape):
        return None
    c = b.value.numpy().astype(np.float64)  # composed in double, written as float32
    if op == "relax.divide":
        if not np.all(c != 0):
            return None
        return a, "relax.divide", 1.0 / c
    return a, op, c


def _compose(chain, op, c):
    """(A, B, ops) of x * A + B after one more step; None for an A or B not applied, ops the steps' names."""
    a, b, ops = chain
    if op in ("relax.multiply", "relax.divide"):  # _step() gave a divide's reciprocal
        return (c if a is None else a * c), (None if b is None else b * c), (*ops, op)
    c = c if op == "relax.add" else -c
    return a, (c if b is None else b + c), (*ops, op)


def _chains(bindings, users):
    """(chains, extended): Var -> (root, (A, B, ops)) for every value a run of steps computes from its root, a step
    extending the run of a single-use DataflowVar; `extended` holds the Vars a later step continued."""
    chains, extended = {}, set()
    for b in bindings:
        got = _step(b.value)
        if got is None:
            continue
        x, op, c = got
        if not _moderate(c):
            continue
        if x in chains and isinstance(x, relax.DataflowVar) and len(users.get(x, [])) == 1:
            root, chain = chains[x]
            composed = _compose(chain, op, c)
            if all(v is None or _moderate(v) for v in composed[:2]):
                extended.add(x)
                chains[b.var] = (root, composed)
                continue
        chains[b.var] = (x, _compose((None, None, ()), op, c))
    return chains, extended


def _moderate(c) -> bool:
    """Every value zero or within MAGNITUDE of 1 either way."""
    a = np.abs(np.asarray(c, np.float64))
    return bool(np.all((a == 0) | ((a <= MAGNITUDE) & (a >= 1 / MAGNITUDE))))


def _normal(chain) -> bool:
    """One step other than a divide, or a multiply then an add (or subtract): nothing to fold."""
    ops = chain[2]
    if "relax.divide" in ops:
        return False
    return len(ops) == 1 or (len(ops) == 2 and ops[0] == "relax.multiply" and ops[1] != "relax.multiply")


def _fold_block(block, stats):
    bindings = list(block.bindings)
    chains, extended = _chains(bindings, var_users(bindings))
    out = []
    for b in bindings:
        got = chains.get(b.var)
        if got is None or b.var in extended or _normal(got[1]):
            out.append(b)  # intermediates stay for dead-code elimination (their one reader no longer reads them)
            continue
        root, (a, c, _) = got
        e = root if a is None else relax.op.multiply(root, relax.const(a.astype(np.float32)))
        e = e if c is None else relax.op.add(e, relax.const(c.astype(np.float32)))
        out.append(relax.VarBinding(b.var, e))
        stats["affine_chains_folded"] += 1
    return block_like(block, out)


# what FoldAffineChains counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("affine_chains_folded", int, "runs of constant multiplies and adds computed as one multiply-add"),
)


@tvm.transform.module_pass(opt_level=1, name="FoldAffineChains")
class FoldAffineChains:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"affine_chains_folded": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out = rewrite_blocks(mod, lambda blk: _fold_block(blk, self.stats))
        if not self.stats["affine_chains_folded"]:
            return mod
        return relax.transform.DeadCodeElimination(["main"])(relax.transform.Normalize()(out))
