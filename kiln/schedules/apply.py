"""ApplyDefaultSchedules: give every kernel of a module the registry's default schedule for the
target. A kernel no rule fits (or whose rule fails) keeps TVM's default lowering; the pass
counts both so the report can say how much of the model is scheduled."""
from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from .registry import FALLBACK, RULES, classify, target_family


def _first_rule_that_applies(func, family: str, kind: str, anchor_hint, lanes: int):
    """The kind's rule, then its fallbacks (FALLBACK), on a fresh schedule each time."""
    for k in (kind, *FALLBACK.get(kind, ())):
        rule = RULES.get((family, k))
        if rule is None:
            continue
        sch = s_tir.Schedule(func)
        _, anchor = classify(sch)
        try:
            rule(sch, anchor, lanes)
            return sch
        except Exception:  # a rule that does not fit this kernel: try the next, else leave it unscheduled
            continue
    return None


@tvm.transform.module_pass(opt_level=2, name="DefaultSchedules")
class ApplyDefaultSchedules:
    def __init__(self, target, lanes: int):
        self.target, self.lanes = target, lanes
        self.stats = {"kernels_scheduled": 0, "kernels_unscheduled": 0}
        self.by_kind: dict[str, int] = {}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        family = target_family(self.target)
        out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or func.attrs is not None and "tirx.is_scheduled" in func.attrs:
                continue
            sch = s_tir.Schedule(func)
            kind, anchor = classify(sch)
            sch = _first_rule_that_applies(func, family, kind, anchor, self.lanes)
            if sch is None:
                self.stats["kernels_unscheduled"] += 1
                continue
            out[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
            self.stats["kernels_scheduled"] += 1
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        return out
