"""MergeSiblingMatmuls: float32 matmuls that multiply the same tensor by different constant weights
(a transformer layer's query, key and value projections) become one matmul by the weights side by
side, with the biases that follow each one merged the same way, and a slice of its columns for each.

Each of those matmuls is a small GEMM (the zoo encoder's three 128 x 128 x 128 projections ran at 76% of
the FMA peak on Zen 4, its 128 x 128 x 512 one at 98%): a parallel loop per call whose start and join
cost as much as a few rows of the product, and an output width that gives the tile few columns to share
each broadcast of x. One wider matmul pays that once. The slices are copies, but each projection is
followed by a reshape and transpose into heads, which copy anyway: the slice fuses into them.
Only DataflowVars are merged (nothing outside the block sees them). `stats["matmuls_merged"]` counts the
matmuls folded into another, `stats["matmul_groups"]` the merged groups."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import op_name
from .module_map import rewrite_with
from .pack_dense_weights import float_matmul_by_constant

MAX_MERGED_COLUMNS = 4096  # wider merged weights would leave a core's L2 at K = 128


def _by_constant(v) -> bool:
    """A float32 matmul of a tensor (a Var of rank 2 or more) by constant float32 [K, N] weights."""
    return (
        op_name(v) == "relax.matmul"
        and isinstance(v.args[0], relax.Var)
        and v.args[0].ty.ndim >= 2
        and (float_matmul_by_constant(v))
    )


def _bias(add, mm_var, n: int):
    """The [N] float32 constant `add` adds to mm_var, else None."""
    if op_name(add) != "relax.add":
        return None
    a, b = add.args
    c = b if a.same_as(mm_var) else a if b.same_as(mm_var) else None
    if not isinstance(c, GenericConst) or str(c.value.dtype) != "float32" or tuple(c.value.shape) != (n,):
        return None
    return c.value.numpy()


class _Group:
    """Sibling matmuls of one x: their vars in binding order, weights, and (when every one is followed by its
    own bias add and nothing else) the add vars and biases."""

    def __init__(self, members: list, values: dict, users: dict):
        self.members = members
        self.weights = [values[m].args[1].value.numpy() for m in members]
        adds = [users[m][0] if len(users.get(m, [])) == 1 else None for m in members]
        biases = [
            _bias(values.get(a), m, w.shape[1]) if a is not None else None
            for a, m, w in zip(adds, members, self.weights)
        ]
        ok = all(b is not None and isinstance(a, relax.DataflowVar) for a, b in zip(adds, biases))
        self.adds, self.biases = (adds, biases) if ok else (None, None)

    def outputs(self) -> list:
        """The vars the slices replace: the bias adds when merged, else the matmuls."""
        return self.adds or self.members


def _groups(block: relax.DataflowBlock) -> list[_Group]:
    values = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
    users = relax.analysis.udchain(block)
    by_x: dict = {}
    for v, call in values.items():
        if isinstance(v, relax.DataflowVar) and _by_constant(call):
            key = (call.args[0], int(call.args[1].value.shape[0]))
            by_x.setdefault(key, []).append(v)
    out = []
    for members in by_x.values():
        widths = [int(values[m].args[1].value.shape[1]) for m in members]
        if len(members) >= 2 and sum(widths) <= MAX_MERGED_COLUMNS:
            out.append(_Group(members, values, users))
    return out


@relax.expr_functor.mutator
class _Merger(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.first: dict = {}  # the first member's var -> its group
        self.skip: set = set()  # the other members' bindings (and merged adds): their slices are emitted already
        self.merged = self.count = 0  # count: the merged groups (rewrite_with reads it)

    def prepare(self, f: relax.Function) -> None:
        self.first.clear()
        self.skip.clear()
        body = f.body
        for block in body.blocks if isinstance(body, relax.SeqExpr) else []:
            if isinstance(block, relax.DataflowBlock):
                for g in _groups(block):
                    self.first[g.members[0]] = g
                    self.skip.update(g.members[1:], g.adds or [])

    def visit_var_binding_(self, binding):
        g = self.first.get(binding.var)
        if g is not None:
            return self._emit(g, binding.value)
        if binding.var in self.skip:
            return None
        return super().visit_var_binding_(binding)

    def _emit(self, g: _Group, first_call) -> None:
        x = self.visit_expr(first_call.args[0])
        y = self.builder_.emit(relax.op.matmul(x, relax.const(np.concatenate(g.weights, axis=1))))
        if g.biases is not None:
            y = self.builder_.emit(relax.op.add(y, relax.const(np.concatenate(g.biases))))
        axis, start = y.ty.ndim - 1, 0
        for out, w in zip(g.outputs(), g.weights):
            n = w.shape[1]
            piece = self.builder_.emit(relax.op.strided_slice(y, axes=[axis], begin=[start], end=[start + n]))
            self.set_var_remap(out, piece)
            start += n
        self.merged += len(g.members) - 1
        self.count += 1


# what MergeSiblingMatmuls counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("matmul_groups", int, "groups of sibling matmuls merged"),
    Counter("matmuls_merged", int, "matmuls merged into a sibling group"),
)


@tvm.transform.module_pass(opt_level=2, name="MergeSiblingMatmuls")
class MergeSiblingMatmuls:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"matmuls_merged": 0, "matmul_groups": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        merger = _Merger(mod)
        out, groups = rewrite_with(mod, merger, merger.prepare)
        self.stats["matmuls_merged"] += merger.merged
        self.stats["matmul_groups"] += groups
        return out
