"""FoldConstants: compute at compile time every op whose inputs are all constants (shape
arithmetic, weight transposes, casts and reshapes of constants), with TVM's FoldConstant.
`stats["constants_folded"]` counts the live op calls that became constants (TVM's FoldConstant
also drops dead bindings; those are not counted as folded)."""

from __future__ import annotations

import tvm
from tvm import relax

from .counting import count_calls


@tvm.transform.module_pass(opt_level=1, name="FoldConstants")
class FoldConstants:
    def __init__(self):
        self.stats = {"constants_folded": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        before = count_calls(relax.transform.DeadCodeElimination(["main"])(mod))
        mod = relax.transform.FoldConstant()(mod)
        self.stats["constants_folded"] += before - count_calls(mod)
        return mod
