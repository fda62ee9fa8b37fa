"""CanonicalizeClip: TVM's ONNX importer lowers Clip with tensor bounds (every Clip since opset
11) straight to opaque `call_tir(maximum|minimum)` kernels, which no graph pass can see through.
Where the bounds are constant scalars this rewrites them back to `relu` (max(x, 0)) or
`clip(x, lo, hi)`, so FuseEpilogue can fuse ReLU/ReLU6 into the producing conv.
`stats["clips_canonicalized"]` counts them. Run after FoldConstants (the importer wraps each
bound in isnan/where, which folding turns into the constant)."""

from __future__ import annotations

import re

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter

KERNEL = re.compile(r"^(maximum|minimum)\d*$")


def _scalar(e) -> float | None:
    if isinstance(e, GenericConst):
        v = e.value.numpy()
        if v.size == 1 and np.issubdtype(v.dtype, np.floating):
            return float(v.reshape(()))
    return None


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.mod, self.count = mod, 0

    def _minmax(self, e):
        """('maximum'|'minimum', x, bound) if e is the importer's clip kernel on a constant bound."""
        if isinstance(e, relax.Var):
            e = self.lookup_binding(e)
        if not (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_tir"):
            return None
        m = KERNEL.match(str(e.args[0].name_hint))
        args = list(e.args[1].fields)
        if m is None or len(args) != 2 or _scalar(args[1]) is None or args[0].ty.dtype != "float32":
            return None
        return m.group(1), args[0], _scalar(args[1])

    def visit_call_(self, call):
        call = super().visit_call_(call)
        outer = self._minmax(call)
        if outer is None:
            return call
        kind, x, bound = outer
        if kind == "minimum":
            # the inner max(x, 0) was already visited (post-order) and became relu(x)
            inner = self.lookup_binding(x) if isinstance(x, relax.Var) else x
            if isinstance(inner, relax.Call) and isinstance(inner.op, tvm.ir.Op) and inner.op.name == "relax.nn.relu":
                return relax.op.clip(inner.args[0], 0.0, bound)
            inner = self._minmax(x)
            if inner is not None and inner[0] == "maximum":
                self.count += 1
                return relax.op.clip(inner[1], inner[2], bound)
            return call
        if bound == 0.0:
            self.count += 1
            return relax.op.nn.relu(x)
        return call


# what CanonicalizeClip counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("clips_canonicalized", int, "constant-bound Clips back to relu/clip"),)


@tvm.transform.module_pass(opt_level=1, name="CanonicalizeClip")
class CanonicalizeClip:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"clips_canonicalized": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        rw = _Rewriter(mod)
        mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        mod["main"] = rw.visit_expr(mod["main"])
        self.stats["clips_canonicalized"] += rw.count
        mod = relax.transform.CanonicalizeBindings()(mod)
        return relax.transform.DeadCodeElimination(["main"])(mod)
