"""The two processes a local tuning run builds and measures with: the build worker, which stops at the
--budget's deadline (BudgetBuilder), and MetaSchedule's LocalRunner, started together and early (Workers)."""

from __future__ import annotations

import concurrent.futures
import time

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderResult

from .builder import WorkerBuilder
from .measure_args import alloc_measure_args


@derived_object
class BudgetBuilder(WorkerBuilder._cls):
    """WorkerBuilder that stops building at a deadline: a candidate asked for after it is a failed
    build (MetaSchedule then skips measuring it), so a round that runs past --budget ends within a
    candidate's build instead of finishing its batch. deadline None: no limit."""

    def __init__(self, out_dir: str, **kwargs):
        super().__init__(out_dir, **kwargs)
        self.deadline: float | None = None
        self.skipped = 0

    def build(self, build_inputs):
        out = []
        for bi in build_inputs:
            if self.deadline is not None and time.perf_counter() >= self.deadline:
                self.skipped += 1
                out.append(BuilderResult(None, "not built: the --budget is spent"))
            else:
                out.append(self._build_one(bi))
        return out


class Workers:
    """The two processes a local tuning run measures with, started together and early: the build
    worker (BudgetBuilder) and MetaSchedule's LocalRunner, whose constructor waits for its own worker
    to start and run a check. Each imports TVM (seconds, more on a loaded host; benchmarks/history.md):
    started before the model is imported, that time overlaps the
    import and optimization instead of coming after them, inside --budget."""

    def __init__(self, builder: BudgetBuilder, runner: concurrent.futures.Future | None, pool=None):
        self.builder, self._runner, self._pool = builder, runner, pool

    @classmethod
    def start(cls, opts) -> Workers:
        """opts: the run's TuneOptions (its rpc_tracker: measured remotely, no local runner)."""
        builder = BudgetBuilder(out_dir="")  # tune_module gives it its folder
        builder.launch()
        if opts.rpc_tracker:  # measured on remote devices: no local runner
            return cls(builder, None)
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kiln-runner-start")
        runner = pool.submit(ms.runner.LocalRunner, timeout_sec=30, f_alloc_argument=alloc_measure_args)
        return cls(builder, runner, pool)

    def local_runner(self):
        return self._runner.result()

    def close(self) -> None:
        self.builder.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # a runner still starting finishes; its worker dies with it
