"""DeadCode: remove bindings whose values are never used (e.g. BatchNorm's running statistics
outputs, branches made dead by folding). `stats["dead_removed"]` counts removed op calls."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter
from .counting import count_calls

# what DeadCode counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("dead_removed", int, "op calls removed as dead code", always=True),)


@tvm.transform.module_pass(opt_level=1, name="DeadCode")
class DeadCode:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"dead_removed": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        before = count_calls(mod)
        mod = relax.transform.DeadCodeElimination(["main"])(mod)
        self.stats["dead_removed"] += before - count_calls(mod)
        return mod
