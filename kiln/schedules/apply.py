"""ApplyDefaultSchedules: give every kernel of a module the registry's default schedule for the
target. A kernel no rule fits (or whose rule fails) keeps TVM's default lowering; the pass
counts both so the report can say how much of the model is scheduled."""
from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from .registry import RULES, classify, target_family


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
            rule = RULES.get((family, kind))
            try:
                if rule is None:
                    raise s_tir.ScheduleError(f"no rule for {kind}")
                rule(sch, anchor, self.lanes)
            except (s_tir.ScheduleError, tvm.TVMError):
                self.stats["kernels_unscheduled"] += 1
                continue
            out[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
            self.stats["kernels_scheduled"] += 1
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        return out
