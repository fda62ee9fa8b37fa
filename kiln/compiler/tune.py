"""`kiln tune`'s driver: import and optimize a model as `kiln compile` would, every kernel left
unscheduled, then hand its kernels to the tuner (kiln/schedules/tuning.py). It sits in the compiler
because it runs the compiler's pipeline; the schedules package only searches and stores schedules."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ..schedules.database import db_dir_for
from ..schedules.tuning import TuneOptions, Workers, tune_module


def prepare(model, compile_options):
    """(module, TVM target, the target's capabilities): the model imported and
    optimized as `kiln compile` would, every kernel left unscheduled (no database applied, no
    default schedules): what MetaSchedule searches from."""
    from ..frontends.importer import import_onnx
    from .optimize import optimize
    from .pipeline import SCHEDULE_ROW

    row = SCHEDULE_ROW[compile_options.target.kind]
    co = dataclasses.replace(
        compile_options, tuning_db=None, disabled_passes=tuple(dict.fromkeys(compile_options.disabled_passes + (row,)))
    )
    imported = import_onnx(model, co.shapes, frozen=co.freeze_inputs, recurrence_kernel=not co.target.is_gpu)
    layout = co.layout if co.layout != "auto" else "NCHWc"
    mod = optimize(imported.mod, co, layout=layout).mod
    target = co.target
    if not target.is_gpu and not target.num_cores:  # MetaSchedule needs num-cores ("llvm -mcpu=znver3" has none)
        from ..runtime.hostinfo import physical_cores

        target = dataclasses.replace(target, num_cores=physical_cores())
    return mod, target.tvm(), co.target.caps


def tune(
    model, compile_options, opts: TuneOptions, progress: Callable[[str], None] = print, start: float | None = None
) -> dict:
    """Import and optimize the model as `kiln compile` would, then tune its kernels (under --budget,
    the import and optimization count against it: the budget is the command's wall time, from `start`,
    a perf_counter the CLI takes before it imports TVM)."""
    if compile_options.target.accel:  # the accelerator's layers, measured by its simulator's cycle count
        from ..accel.vta.tune import tune as tune_accelerator

        return tune_accelerator(model, compile_options, opts, progress)
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
