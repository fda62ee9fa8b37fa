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

from ..rules.kinds import strip_module


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

    from ..rules.apply import first_rule_that_applies
    from ..rules.registry import target_family
    from .database import measured_defaults, save_measured_defaults, trace_digest

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
    """(default schedule's measured seconds, seconds of the record a compile applies) of each task, None
    where unknown (a default record compacted away, or no record). The record applied is the best one,
    unless it lost to the default when both were measured again (confirm_records): then the default."""
    from .database import checked_records, measured_defaults, trace_digest

    ledger, checked = measured_defaults(db_dir), checked_records(db_dir)
    out = []
    for t in tasks:
        mod = workload(t)
        if not db.has_workload(mod):
            out.append((None, None))
            continue
        recs = db.get_top_k(db.commit_workload(mod), 1 << 20)
        key = str(tvm_ffi.structural_hash(mod))
        digests = set(ledger.get(key, ()))
        default = next((_secs(r) for r in recs if trace_digest(r.trace) in digests), None)
        lost = bool(recs) and checked.get(key, {}).get(trace_digest(recs[0].trace)) == "slower"
        out.append((default, default if lost else (_secs(recs[0]) if recs else None)))
    return out


def _secs(record) -> float:
    return statistics.fmean(float(x) for x in record.run_secs)


def confirm_records(
    tasks,
    target,
    db,
    db_dir: Path,
    builder,
    runner,
    lanes: int,
    registers: int = 16,
    deadline: float | None = None,
    pairs: int = 2,
) -> tuple[int, int]:
    """Measure each task's best record again, alternately with its default schedule (`pairs` runs of
    each, the fastest of each kept), where the best is not a default and was not checked before: a
    default measured once, at a moment the machine was busy (another process, a neighbour on a shared
    host), let a 3x slower Winograd schedule count as faster and ship in the artifact. The default's new
    time is committed as a record (the ledger already names its trace); the verdict goes to the
    database's CHECKED ledger, and a record that lost is never applied. Returns (confirmed, rejected)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from ..rules.apply import first_rule_that_applies
    from ..rules.registry import target_family
    from .database import checked_records, measured_defaults, save_checked_records, trace_digest

    ledger, checked = measured_defaults(db_dir), checked_records(db_dir)
    device = "cpu" if target.kind.name == "llvm" else target.kind.name
    confirmed = rejected = 0
    for t in tasks:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        mod = workload(t)
        if not db.has_workload(mod):
            continue
        wl = db.commit_workload(mod)
        key = str(tvm_ffi.structural_hash(mod))
        (best,) = db.get_top_k(wl, 1) or (None,)
        verdicts = checked.setdefault(key, {})
        if best is None or trace_digest(best.trace) in ledger.get(key, ()) or trace_digest(best.trace) in verdicts:
            continue
        _, default = first_rule_that_applies(t.dispatched[0]["main"], target_family(target), lanes, registers)
        if default is None or trace_digest(default.trace) not in ledger.get(key, ()):
            continue  # no measured default to compare with
        candidate = tvm.s_tir.Schedule(mod)
        best.trace.apply_to_schedule(candidate, remove_postproc=False)
        built = builder.build([BuilderInput(default.mod, target), BuilderInput(candidate.mod, target)])
        if any(b.error_msg for b in built):
            continue
        args = ArgInfo.from_entry_func(default.mod)
        inputs = [RunnerInput(built[i % 2].artifact_path, device, args) for i in range(2 * pairs)]
        results = [f.result() for f in runner.run(inputs)]
        if any(r.error_msg or not r.run_secs for r in results):
            continue
        times = [statistics.fmean(float(x) for x in r.run_secs) for r in results]
        d, b = min(times[0::2]), min(times[1::2])
        arg_info = ArgInfo.from_prim_func(mod["main"])
        for sch, secs in ((default, d), (candidate, b)):  # both as measured now, side by side
            db.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, [secs], target, arg_info))
        verdicts[trace_digest(best.trace)] = "faster" if b < d else "slower"
        confirmed, rejected = confirmed + (b < d), rejected + (b >= d)
    if confirmed + rejected:
        save_checked_records(db_dir, {k: v for k, v in checked.items() if v})
    return confirmed, rejected


def faster_than_default(times) -> int:
    """Tasks whose best record is faster than their measured default schedule."""
    return sum(1 for d, b in times if d is not None and b is not None and b < d)


def estimated_latency(tasks, times) -> tuple[float | None, float | None, list[str]]:
    """The model's latency as the sum of its kernels' measured times (each times how often it
    runs), with default schedules and with the best records, in ms, and the names of the kernels
    left out of both: those with no record at all (every measurement failed), which keep their
    default schedule either way. (None, None, ...) when a kernel has a record but its default's time
    is unknown: then the two sums are not comparable."""
    kept = [(t, d, b) for t, (d, b) in zip(tasks, times) if not (d is None and b is None)]
    left_out = [str(t.task_name) for t, (d, b) in zip(tasks, times) if d is None and b is None]
    if not kept or any(d is None or b is None for _, d, b in kept):
        return None, None, left_out
    default = sum(float(t.weight) * d for t, d, _ in kept) * 1e3
    return default, sum(float(t.weight) * b for t, _, b in kept) * 1e3, left_out
