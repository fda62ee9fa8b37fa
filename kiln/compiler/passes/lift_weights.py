"""LiftWeights: turn the constants left in `main` after optimization into trailing parameters, so
the weights ship as their own artifact member (weights.bin) and the library holds code only.
Scalars and tiny constants stay inline. The lifted arrays are in `pass.weights`, in order."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

MIN_ELEMENTS = 16


@relax.expr_functor.mutator
class _Lifter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.params: list[relax.Var] = []
        self.values: list[np.ndarray] = []
        self._seen: list[tuple[object, relax.Var]] = []

    def visit_generic_const_(self, c):
        value = c.value.numpy()
        if value.size < MIN_ELEMENTS:
            return c
        for old, var in self._seen:
            if old.same_as(c):
                return var
        var = relax.Var(f"kiln_w{len(self.params)}", c.ty)
        self.params.append(var)
        self.values.append(value)
        self._seen.append((c, var))
        return var


@tvm.transform.module_pass(opt_level=0, name="LiftWeights")
class LiftWeights:
    def __init__(self, func_name: str = "main"):
        self.func_name = func_name
        self.weights: list[np.ndarray] = []

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        f = mod[self.func_name]
        lifter = _Lifter(mod)
        body = lifter.visit_expr(f.body)
        self.weights = lifter.values
        new = relax.Function(list(f.params) + lifter.params, body, f.ret_ty, f.is_pure, f.attrs, f.span)
        mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)  # never mutate the caller's module
        mod[self.func_name] = new
        return mod
