"""Each workload's default schedule as its baseline in the tuning database: measured once by
`kiln tune` (trace and run time, like a MetaSchedule candidate, and noted in the database's ledger
of measured defaults), so a workload's best record is its default unless a candidate beat it;
and the times of the default and of the best record that the tuning summary compares.

A task's workload is its kernel with Kiln's kind annotations stripped (kinds.strip: the database
keys on the computation); its default schedule is the registry's rule for the annotated kernel."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from .kinds import strip_module


def workload(task) -> tvm.IRModule:
    """The module MetaSchedule tunes and the database keys a task on."""
    return strip_module(task.dispatched[0])


def record_default_schedules(
    tasks,
    target,
    db,
    builder,
    runner,
    lanes: int,
    db_dir: Path | None = None,
    registers: int = 16,
    deadline: float | None = None,
) -> int:
    """Measure the default schedule of every task whose database has no record of it yet (a new
    workload, or a default rule that changed since the last run) and commit it (trace + run time)
    like a MetaSchedule candidate; returns how many it recorded. With `db_dir`, the database's ledger
    of measured defaults (database.DEFAULTS) also counts as a record: a compacted database keeps only
    each workload's best record, which beat the default when both were measured. `deadline`
    (perf_counter): no measurement starts after it (--budget); the rest are measured by the next run."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from .apply import first_rule_that_applies
    from .database import measured_defaults, save_measured_defaults, trace_digest
    from .registry import target_family

    ledger = measured_defaults(db_dir) if db_dir is not None else {}
    done = noted = 0
    for t in tasks:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        _, sch = first_rule_that_applies(t.dispatched[0]["main"], target_family(target), lanes, registers)
        if sch is None:
            continue
        mod = workload(t)
        trace = str(sch.trace.as_json())
        key, digest = str(tvm_ffi.structural_hash(mod)), trace_digest(sch.trace)
        if db.has_workload(mod):
            if digest in ledger.get(key, ()):
                continue
            if any(str(r.trace.as_json()) == trace for r in db.get_top_k(db.commit_workload(mod), 1 << 20)):
                ledger.setdefault(key, []).append(digest)
                noted += 1
                continue
        (built,) = builder.build([BuilderInput(sch.mod, target)])
        if built.error_msg:
            continue
        device = "cpu" if target.kind.name == "llvm" else target.kind.name
        (future,) = runner.run([RunnerInput(built.artifact_path, device, ArgInfo.from_entry_func(sch.mod))])
        result = future.result()
        if result.error_msg or not result.run_secs:
            continue
        db.commit_tuning_record(
            ms.database.TuningRecord(
                sch.trace, db.commit_workload(mod), result.run_secs, target, ArgInfo.from_prim_func(mod["main"])
            )
        )
        ledger.setdefault(key, []).append(digest)
        done += 1
    if db_dir is not None and done + noted:
        save_measured_defaults(db_dir, ledger)
    return done


def task_times(tasks, db, db_dir: Path) -> list[tuple[float | None, float | None]]:
    """(default schedule's measured seconds, best record's seconds) of each task, None where
    unknown (a default record compacted away, or no record)."""
    from .database import measured_defaults, trace_digest

    ledger = measured_defaults(db_dir)
    out = []
    for t in tasks:
        mod = workload(t)
        if not db.has_workload(mod):
            out.append((None, None))
            continue
        recs = db.get_top_k(db.commit_workload(mod), 1 << 20)
        digests = set(ledger.get(str(tvm_ffi.structural_hash(mod)), ()))

        def secs(r):
            return statistics.fmean(float(x) for x in r.run_secs)

        default = next((secs(r) for r in recs if trace_digest(r.trace) in digests), None)
        out.append((default, secs(recs[0]) if recs else None))
    return out


def faster_than_default(times) -> int:
    """Tasks whose best record is faster than their measured default schedule."""
    return sum(1 for d, b in times if d is not None and b is not None and b < d)


def estimated_latency(tasks, times) -> tuple[float | None, float | None]:
    """The model's latency as the sum of its kernels' measured times (each times how often it
    runs), with default schedules and with the best records, in ms; None when a kernel's default
    time is unknown (then the two are not comparable)."""
    if not times or any(d is None or b is None for d, b in times):
        return None, None
    w = [float(t.weight) for t in tasks]
    return (sum(wi * d for wi, (d, _) in zip(w, times)) * 1e3, sum(wi * b for wi, (_, b) in zip(w, times)) * 1e3)
