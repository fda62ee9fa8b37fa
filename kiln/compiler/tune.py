"""`kiln tune`'s driver: import and optimize a model as `kiln compile` would, every kernel left
unscheduled, then hand its kernels to the tuner (kiln/schedules/tuning/tuning.py). It sits in the compiler
because it runs the compiler's pipeline; the schedules package only searches and stores schedules."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ..schedules.tuning.database import db_dir_for
from ..schedules.tuning.tuning import TuneOptions, Workers, tune_module


def prepare(model, compile_options):
    """(module, TVM target, the target's capabilities): the model imported and
    optimized as `kiln compile` would, every kernel left unscheduled (no database applied, no
    default schedules): what MetaSchedule searches from."""
    from ..frontends.importer import import_onnx
    from .optimize import optimize

    backend = compile_options.backend
    row = backend.schedule_row
    co = dataclasses.replace(
        compile_options, tuning_db=None, disabled_passes=tuple(dict.fromkeys(compile_options.disabled_passes + (row,)))
    )
    imported = import_onnx(model, co.shapes, frozen=co.freeze_inputs, recurrence_kernel=backend.recurrence_kernel)
    layout = co.layout if co.layout != "auto" else "NCHWc"
    mod = optimize(imported.mod, co, layout=layout).mod
    return mod, backend.tuning_target(co.target).tvm(), co.target.caps


def tune(
    model, compile_options, opts: TuneOptions, progress: Callable[[str], None] = print, start: float | None = None
) -> dict:
    """`kiln tune`: the tuner of the target's backend (MetaSchedule's is tune_kernels, an accelerator
    brings its own). Under --budget the import and optimization count against it: the budget is the
    command's wall time, from `start`, a perf_counter the CLI takes before it imports TVM."""
    return compile_options.backend.tune(model, compile_options, opts, progress, start)


def summary(compile_options, result: dict) -> str:
    """The closing lines `kiln tune` prints, in the words of the backend's tuner."""
    return compile_options.backend.tune_summary(result)


def compact(compile_options, db) -> tuple[int, int]:
    """(records before, after) keeping the best of each workload in the backend's database `db`."""
    return compile_options.backend.compact_records(db)


def tune_kernels(
    model, compile_options, opts: TuneOptions, progress: Callable[[str], None] = print, start: float | None = None
) -> dict:
    """MetaSchedule: import and optimize the model as `kiln compile` would, then tune its kernels."""
    start = time.perf_counter() if start is None else start
    if not opts.rpc_tracker:
        from .hostrun import require_host_runs

        require_host_runs(
            compile_options.target,
            "kiln tune",
            "--target",
            "measure on devices of the target's kind with --rpc-tracker HOST:PORT --rpc-key KEY, "
            "or tune on such a machine",
        )
    workers = Workers.start(opts)  # they import TVM while the model is imported and optimized
    try:
        mod, target, caps = prepare(model, compile_options)
        db_dir = db_dir_for(opts.db_root, compile_options.target)
        return tune_module(
            mod,
            target,
            db_dir,
            opts,
            progress,
            lanes=caps.f32_block,
            registers=caps.vector_registers,
            start=start,
            workers=workers,
        )
    finally:
        workers.close()  # idempotent: tune_module stops them too, but not when it fails before measuring
