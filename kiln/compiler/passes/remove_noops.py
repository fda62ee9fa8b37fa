"""RemoveNoOps: drop ops that compute nothing. Casts to the same dtype, reshapes to the same
shape, reshape chains (only the last counts), transposes that cancel (or compose into one),
identity transposes, broadcasts to the same shape, expand_dims undone by squeeze, inference
Dropout, and a split into one piece (torchvision's detection exports; TVM's ConvertLayout fails on
it: "Invalid Call"). `stats["noops_removed"]` counts the ops removed."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter
from ..ir import ints
from .counting import static_shape
from .module_map import rewrite_functions


@relax.expr_functor.mutator
class _NoOpRemover(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.removed = 0

    def _producer(self, e):
        if isinstance(e, relax.Var):
            v = self.lookup_binding(e)
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
                return v
        return None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or not call.args:
            return call
        name, x = call.op.name, call.args[0]
        same_shape = static_shape(x) is not None and static_shape(x) == static_shape(call)
        if name == "relax.astype" and isinstance(x.ty, relax.TensorType) and x.ty.dtype == call.attrs.dtype:
            return self._drop(x)
        if name == "relax.split" and _one_piece(call.attrs) and isinstance(call.ty, relax.TensorType):
            self.removed += 1  # TVM types split(x, []) as x itself, not a 1-tuple
            return x
        if name in ("relax.reshape", "relax.broadcast_to") and same_shape:
            return self._drop(x)
        prod = self._producer(x)
        if name == "relax.reshape" and prod is not None and prod.op.name == "relax.reshape":
            self.removed += 1
            return relax.op.reshape(prod.args[0], call.args[1])
        if name == "relax.permute_dims":
            axes = ints(call.attrs.axes) if call.attrs.axes is not None else None
            if axes is not None and axes == list(range(len(axes))):
                return self._drop(x)
            if (
                axes is not None
                and prod is not None
                and prod.op.name == "relax.permute_dims"
                and prod.attrs.axes is not None
            ):
                inner = ints(prod.attrs.axes)
                composed = [inner[a] for a in axes]
                self.removed += 1
                if composed == list(range(len(composed))):
                    self.removed += 1
                    return prod.args[0]
                return relax.op.permute_dims(prod.args[0], composed)
        if (
            name == "relax.squeeze"
            and prod is not None
            and prod.op.name == "relax.expand_dims"
            and call.attrs.axis is not None
            and static_shape(prod.args[0]) == static_shape(call)
        ):
            self.removed += 2
            return prod.args[0]
        return call

    def visit_tuple_getitem_(self, op):
        op = super().visit_tuple_getitem_(op)
        prod = self._producer(op.tuple_value)
        if op.index == 0 and prod is not None and prod.op.name == "relax.nn.dropout":
            return self._drop(prod.args[0])
        if op.index == 0 and prod is not None and prod.op.name == "relax.split" and _one_piece(prod.attrs):
            return self._drop(prod.args[0])
        return op

    def _drop(self, x):
        self.removed += 1
        return x


def _one_piece(attrs) -> bool:
    """A split into one section: no indices, or 1 section."""
    ios = attrs.indices_or_sections
    if isinstance(ios, (int, tvm.tirx.IntImm)):
        return int(ios) == 1
    return len(ios) == 0


# what RemoveNoOps counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("noops_removed", int, "ops that compute nothing, removed", always=True),)


@tvm.transform.module_pass(opt_level=1, name="RemoveNoOps")
class RemoveNoOps:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"noops_removed": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        remover = _NoOpRemover(mod)
        mod = rewrite_functions(mod, remover.visit_expr)
        self.stats["noops_removed"] += remover.removed
        mod = relax.transform.CanonicalizeBindings()(mod)
        return relax.transform.DeadCodeElimination(["main"])(mod)
