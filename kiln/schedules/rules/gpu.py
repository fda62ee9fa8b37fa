"""GPU kernels: TVM's dlight rules (matmul, GEMV, reductions, and a fallback that binds any
remaining kernel to blocks and threads), applied to every kernel MetaSchedule has no record for.
Convolutions take the fallback (correct, not fast: tune them with `kiln tune` on the GPU host)."""

from __future__ import annotations

import tvm
from tvm import tirx

from ...counters import Counter
from .apply import is_scheduled

# what ApplyGPUSchedules counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("kernels_scheduled", int, "kernels given a schedule", always=True),
    Counter("kernels_unscheduled", int, "kernels left with no schedule", always=True),
)


@tvm.transform.module_pass(opt_level=0, name="GPUSchedules")
class ApplyGPUSchedules:
    COUNTERS = COUNTERS

    def __init__(self, target):
        self.target = target
        self.stats = {"kernels_scheduled": 0, "kernels_unscheduled": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        from tvm.s_tir import dlight as dl

        todo = [gv for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc) and not is_scheduled(f)]
        mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)  # dlight mutates the module it is given
        with self.target:
            mod = dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
            )(mod)
        for gv in todo:
            self.stats["kernels_scheduled" if is_scheduled(mod[gv]) else "kernels_unscheduled"] += 1
        return mod
