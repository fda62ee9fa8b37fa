"""FoldConstants: compute at compile time every op whose inputs are all constants (shape
arithmetic, weight transposes, casts and reshapes of constants), with TVM's FoldConstant.
`stats["constants_folded"]` counts the op calls that disappeared."""
from __future__ import annotations

import tvm
from tvm import relax

from .counting import count_calls


@tvm.transform.module_pass(opt_level=1, name="FoldConstants")
class FoldConstants:
    def __init__(self):
        self.stats = {"constants_folded": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        before = count_calls(mod)
        mod = relax.transform.FoldConstant()(mod)
        self.stats["constants_folded"] += before - count_calls(mod)
        return mod
