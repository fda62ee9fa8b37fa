"""`kiln tune`: MetaSchedule on Kiln's fused kernels, sized for a small machine.

- search: evolutionary, a small population and few measured candidates per round, so a trial
  is cheap on a small machine, unlike with MetaSchedule's defaults (benchmarks/history.md, "Tuning");
- builds in one reused worker process with a time limit per candidate (kiln/schedules/tuning/builder.py;
  MetaSchedule's LocalBuilder starts its workers for every batch), measures in MetaSchedule's LocalRunner;
- rounds: each round tunes up to `round_trials` more trials across tasks (MetaSchedule's
  gradient task scheduler shares them by each task's weighted latency); under --budget (the whole
  command's wall time) a round is only started, and sized, when its estimated time fits in what is
  left (round_size), and builds stop at a deadline as the backstop (BudgetBuilder);
- honest summary: how many tasks have a record faster than their default schedule (not just a
  record), and the model's estimated latency with default schedules and with the best records;
- resumable: records go to the JSON database as they are measured; a killed run loses only the
  candidates in flight, and a rerun skips what is already measured;
- never worse than no tuning: before searching, each workload's default schedule (Kiln's rule,
  kiln/schedules/rules/rules.py) is measured by the same runner and recorded with its trace unless the
  database already holds that trace, so the best record of a workload is the default schedule
  unless a candidate beat it (a rule changed since the last run gets measured again; baseline.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from ...errors import OptionsError
from ...optfield import option
from ..rules.apply import is_scheduled
from ..rules.kinds import UNTUNED, kernel_kind
from ..rules.tvmscript import import_tensor_intrinsics
from .baseline import (
    confirm_records,
    estimated_latency,
    faster_than_default,
    record_default_schedules,
    task_times,
    workload,
)
from .database import open_database
from .rpc import parse_tracker, rpc_runner
from .workers import Workers


def parse_duration(text: str) -> float:
    """'90', '90s', '20m', '1.5h' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise OptionsError(f"bad duration {text!r}", where="--budget", fix="write it like 90s, 20m or 1.5h") from None


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """`kiln tune`'s options; the flagged fields are its command-line flags (kiln/cli/build.py)."""

    db_root: str = option("tuning_logs", "database root", name="--db", metavar="DIR")
    trials: int | None = option(None, "measured candidates in all", metavar="N", type=int)
    budget_s: float | None = option(
        None, "wall-clock budget, e.g. 90s, 20m, 1.5h", name="--budget", metavar="DURATION", type=parse_duration
    )
    round_trials: int = 16
    trials_per_iter: int = 8
    population: int = 32
    seed: int = 0
    rpc_tracker: str | None = option(
        None, "measure on the devices of TVM's RPC tracker (needs --rpc-key)", metavar="HOST:PORT"
    )  # measure there, not here
    rpc_key: str | None = option(None, "the key the RPC servers registered with", metavar="KEY")
    rpc_workers: int | None = option(
        None, "devices measured in parallel (default: every free one with the key)", metavar="N", type=int
    )

    def __post_init__(self):
        if (self.rpc_tracker is None) != (self.rpc_key is None):
            raise OptionsError(
                "--rpc-tracker and --rpc-key go together",
                where="--rpc-tracker / --rpc-key",
                fix="e.g. --rpc-tracker 127.0.0.1:9190 --rpc-key rpi5",
            )
        if self.rpc_tracker is not None:
            parse_tracker(self.rpc_tracker)
        if (self.trials is None) == (self.budget_s is None):
            raise OptionsError(
                "give exactly one of --trials N and --budget DURATION",
                where="--trials / --budget",
                fix="e.g. --trials 64 or --budget 20m",
            )
        if self.trials is not None and self.trials < 1 or self.budget_s is not None and self.budget_s <= 0:
            raise OptionsError(
                "trials and budget must be positive",
                where="--trials / --budget",
                fix="e.g. --trials 64 or --budget 20m",
            )


def extract(mod: tvm.IRModule, target) -> list:
    """MetaSchedule's tasks for the kernels there is something to search: not the ones that come
    scheduled (Kiln's vdpbf16ps C kernels), which have no blocks to schedule, nor the kinds.UNTUNED
    ones (AMX tile kernels), whose search space holds nothing as fast as their default, nor run-time
    sized ones (a detector's post-NMS boxes, a TopK whose k is a scalar argument: the static rules
    cannot size them, MetaSchedule's runner cannot make their arguments; every build schedules them)."""
    tasks = ms.relax_integration.extract_tasks(mod, target)
    return [
        t
        for t in tasks
        if not is_scheduled(t.mod["main"]) and _kind(t.mod["main"]) not in UNTUNED and _measurable(t.mod["main"])
    ]


def _measurable(func) -> bool:
    """Static buffer shapes, and no parameter that is not a buffer (MetaSchedule's ArgInfo takes buffers only)."""
    from ..rules.apply import is_static

    return is_static(func) and all(hasattr(p.ty, "shape") for p in func.params)


def _kind(func) -> str | None:
    try:
        return kernel_kind(func)
    except Exception:  # an unclassifiable kernel is tuned as before
        return None


def _strategy(opts: TuneOptions):
    return ms.search_strategy.EvolutionarySearch(
        population_size=opts.population,
        init_measured_ratio=0.2,
        init_min_unmeasured=opts.population // 2,
        genetic_num_iters=2,
        genetic_mutate_prob=0.85,
        genetic_max_fail_count=3,
    )


def _contexts(tasks, opts: TuneOptions, seed: int):
    """One TuneContext (and search strategy) per task, without MetaSchedule's per-task log files
    (its logging set-up breaks on the second use in one process); Kiln prints its own progress."""
    ctxs = [
        ms.TuneContext(
            mod=workload(t),
            target=t.target,
            space_generator="post-order-apply",
            search_strategy=_strategy(opts),
            task_name=t.task_name,
            logger=_QUIET,
            rand_state=seed + i,
            num_threads=max(1, os.cpu_count() or 1),
        )
        for i, t in enumerate(tasks)
    ]
    return ctxs, [float(t.weight) for t in tasks]


def latency_shares(tasks) -> list[float]:
    """Each task's share of the model's estimated latency: its FLOPs times how often it runs."""
    from ..rules.apply import estimated_flops

    est = [max(estimated_flops(t.dispatched[0]["main"]), 1.0) * float(t.weight) for t in tasks]
    total = sum(est)
    return [e / total for e in est]


def pick_tasks(shares: list[float], trials_done: list[int], k: int) -> list[int]:
    """The k tasks to tune this round: the budget is shared by estimated latency, so a task's
    priority is its share over the trials it already had (every task gets its first trials
    before any gets its second helping of the same size)."""
    order = sorted(range(len(shares)), key=lambda i: (trials_done[i] > 0, -shares[i] / (1 + trials_done[i])))
    return sorted(order[:k])


_QUIET = logging.getLogger("kiln.tune.meta_schedule")
_QUIET.setLevel(logging.WARNING)


FIRST_TRIAL_GUESS_S = 1.0  # seconds a trial is assumed to cost before any was timed (no default measured this run)
# a first-round trial over one default schedule's measurement (the search, cost model and runner come on top)
FIRST_ROUND_FACTOR = 4.0
BUDGET_SAFETY = 1.15  # a round is started only if its estimated time, times this, fits in what is left of the budget
BUDGET_RESERVE_S = 2.0  # at least this long before the budget ends, builds stop (then the batch's runs and the summary)
POST_BUILD_SHARE = 0.4  # of a batch's time, what comes after its builds (measuring, the cost model's update)


def round_size(opts: TuneOptions, done_trials: int, elapsed: float, per_trial_s: float) -> int:
    """How many trials the next round may have: the rest of --trials, or under --budget the most
    whole batches (trials_per_iter) whose estimated time fits in what is left; 0 when none does.
    MetaSchedule's rounds cannot be cut short (a batch searches, builds, then measures; the search
    and the measurements are most of it), so the budget is kept by not starting a round that would
    end past it; BudgetBuilder's deadline is the backstop for an estimate that was wrong."""
    if opts.trials is not None:
        return max(0, min(opts.round_trials, opts.trials - done_trials))
    left = opts.budget_s - elapsed
    batch_s = max(per_trial_s, 1e-3) * opts.trials_per_iter
    fit = int(left / (batch_s * BUDGET_SAFETY)) * opts.trials_per_iter
    return max(0, min(opts.round_trials, fit))


@dataclasses.dataclass
class _Run:
    """One tune_module run: what its phases (the defaults, the search rounds, the summary) share."""

    tasks: list
    target: object
    db: object
    db_path: Path
    opts: TuneOptions
    progress: Callable[[str], None]
    lanes: int
    registers: int
    start: float
    builder: object = None
    runner: object = None
    have: int = 0  # records in the database
    done_trials: int = 0
    rounds: int = 0
    per_trial: float = FIRST_TRIAL_GUESS_S
    search_s: float = 0.0
    checks: list = dataclasses.field(default_factory=lambda: [0, 0])  # best records confirmed / rejected
    shares: list = dataclasses.field(default_factory=list)
    per_task: list = dataclasses.field(default_factory=list)

    def records(self) -> int:
        return len(self.db.get_all_tuning_records())


def tune_module(
    mod: tvm.IRModule,
    target,
    db_dir: Path,
    opts: TuneOptions,
    progress: Callable[[str], None] = print,
    lanes: int = 16,
    registers: int = 16,
    start: float | None = None,
    workers: Workers | None = None,
) -> dict:
    """Tune the module's tasks into the database at db_dir; `start` (perf_counter) is when the
    budget started (tune() passes its own start, so import and optimization count too). `workers`:
    started by the caller before it imported the model (their start-up then overlaps it); tune_module
    stops them either way."""
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)  # Kiln prints its own progress
    start = time.perf_counter() if start is None else start
    tasks = extract(mod, target)
    if not tasks:
        raise OptionsError(
            "the model has no kernels to tune",
            where="kiln tune",
            fix="every kernel already has a fixed schedule (or the model computes nothing); compile it directly",
        )
    db_path = Path(db_dir)
    db = open_database(db_path)  # opened (and repaired) once; every round commits to it
    run = _Run(tasks, target, db, db_path, opts, progress, lanes, registers, start)
    before = run.have = run.records()
    run.shares, run.per_task = latency_shares(tasks), [0] * len(tasks)
    workers = workers or Workers.start(opts)
    runner, devices = rpc_runner(opts) if opts.rpc_tracker else (None, 1)
    if opts.rpc_tracker:
        progress(
            f"measuring on {opts.rpc_workers or devices} device(s) with key {opts.rpc_key!r} at {opts.rpc_tracker}"
        )
    t = time.perf_counter()
    import_tensor_intrinsics(target.kind.name)  # before the budget sizes any round, not inside the first one
    phases = {"setup": t - start, "tvm_import": time.perf_counter() - t}
    with (
        tempfile.TemporaryDirectory(prefix="kiln-tune-", ignore_cleanup_errors=True) as tmp,
        contextlib.closing(workers),
    ):  # closing: stops the worker process
        run.builder = workers.builder
        run.builder.out_dir = tmp
        run.builder.start()  # here, so a worker that cannot start is a ResourceError, not an error inside MetaSchedule
        run.runner = runner or workers.local_runner()
        seeded = _measure_defaults(run, phases)
        _search(run)
    phases["search"] = run.search_s
    return _summary(run, before, seeded, phases, devices)


def _measure_defaults(run: _Run, phases: dict) -> int:
    """Measure the default schedule of every task new to the database (the baseline a candidate must beat);
    how many were measured. Under --budget the biggest kernels' first, and none started past the builds'
    deadline."""
    opts, tasks, start = run.opts, run.tasks, run.start
    t = time.perf_counter()
    order = sorted(range(len(tasks)), key=lambda i: -run.shares[i]) if opts.budget_s is not None else range(len(tasks))
    deadline = start + opts.budget_s - BUDGET_RESERVE_S if opts.budget_s is not None else None
    seeded = record_default_schedules(
        [tasks[i] for i in order],
        run.target,
        run.db,
        run.builder,
        run.runner,
        run.lanes,
        run.db_path,
        run.registers,
        deadline,
    )
    phases["defaults"] = time.perf_counter() - t
    if deadline is not None and time.perf_counter() >= deadline:
        run.progress(
            f"the --budget ran out measuring the default schedules ({seeded} measured): the next run measures "
            "the rest before it searches"
        )
    if seeded:
        # one build + one measurement each, like a trial, which also runs the search and the cost model
        run.per_trial = max(run.per_trial, FIRST_ROUND_FACTOR * phases["defaults"] / seeded)
        run.have = run.records()
        run.progress(
            f"measured the default schedules of {seeded} kernel(s) new to the database: "
            "the baseline each candidate must beat "
            f"({time.perf_counter() - start:.0f}s)"
        )
    return seeded


def _search(run: _Run) -> None:
    """Search rounds until the trials or the budget run out, or a whole rotation of the tasks finds nothing new."""
    opts, empty = run.opts, 0
    while True:
        elapsed = time.perf_counter() - run.start
        n = round_size(opts, run.done_trials, elapsed, run.per_trial)
        if opts.budget_s is not None:  # set after the defaults: the baseline is always measured
            reserve = max(BUDGET_RESERVE_S, POST_BUILD_SHARE * run.per_trial * opts.trials_per_iter)
            run.builder.deadline = run.start + opts.budget_s - reserve
        if opts.budget_s is not None and not run.rounds:
            n = min(n, opts.trials_per_iter)  # one batch first: what it costs sizes the later rounds
        if n <= 0:
            if opts.budget_s is not None and (opts.trials is None):
                run.progress(
                    f"stopping with {max(0.0, opts.budget_s - elapsed):.0f}s of the budget left: a batch of "
                    f"{opts.trials_per_iter} trials is estimated at {run.per_trial * opts.trials_per_iter:.0f}s"
                )
            break
        measured = _round(run, n)
        empty = 0 if measured else empty + 1
        if empty >= -(-len(run.tasks) // max(1, n // opts.trials_per_iter)):  # a whole rotation found nothing new
            break


def _round(run: _Run, n: int) -> int:
    """One search round of n trials over the tasks with the most estimated latency per trial so far (a fresh
    MetaSchedule task scheduler per round would otherwise start at task 0 every time); the records it added."""
    opts, tasks = run.opts, run.tasks
    chosen = pick_tasks(run.shares, run.per_task, max(1, n // opts.trials_per_iter))
    ctxs, weights = _contexts([tasks[i] for i in chosen], opts, opts.seed + run.rounds)
    for i in chosen:
        run.per_task[i] += opts.trials_per_iter
    t = time.perf_counter()
    # max_trials_global counts this call's trials
    ms.tune.tune_tasks(
        tasks=ctxs,
        task_weights=weights,
        work_dir=str(run.db_path),
        max_trials_global=n,
        max_trials_per_task=None,
        num_trials_per_iter=opts.trials_per_iter,
        builder=run.builder,
        runner=run.runner,
        database=run.db,
        cost_model="xgb",
    )
    measured = run.records() - run.have
    ok, lost = confirm_records(
        [tasks[i] for i in chosen],
        run.target,
        run.db,
        run.db_path,
        run.builder,
        run.runner,
        run.lanes,
        run.registers,
        run.builder.deadline,
    )
    run.checks[0], run.checks[1] = run.checks[0] + ok, run.checks[1] + lost
    run.have = run.records()
    run.rounds += 1
    run.done_trials += max(measured, 1)  # a round that finds nothing new still counts, so we terminate
    run.search_s += time.perf_counter() - t
    run.per_trial = run.search_s / run.done_trials  # a round's whole cost (search, cost model, builds, runs) per trial
    elapsed = time.perf_counter() - run.start
    left = (
        f"{max(0.0, opts.budget_s - elapsed):.0f}s left"
        if opts.budget_s
        else f"{max(0, opts.trials - run.done_trials)} trials left"
    )
    searched = sum(1 for c in run.per_task if c)
    faster = faster_than_default(task_times(tasks, run.db, run.db_path))
    run.progress(
        f"round {run.rounds}: {searched}/{len(tasks)} tasks searched, {faster} with a record faster than the "
        f"default, {run.done_trials} trials, {run.per_trial:.2f} s/trial, {elapsed:.0f}s elapsed, {left}"
    )
    return measured


def _summary(run: _Run, before: int, seeded: int, phases: dict, devices: int) -> dict:
    """tune_module's result: what was searched and measured, the estimated latencies, where the time went."""
    times = task_times(run.tasks, run.db, run.db_path)
    default_ms, tuned_ms, unmeasured = estimated_latency(run.tasks, times)
    seconds = time.perf_counter() - run.start
    phases["other"] = max(0.0, seconds - sum(phases.values()))  # worker start, runner check, database reads
    return {
        "tasks": len(run.tasks),
        "tasks_searched": sum(1 for c in run.per_task if c),
        "tasks_faster": faster_than_default(times),
        "trials": run.done_trials,
        "records_confirmed": run.checks[0],
        "records_rejected": run.checks[1],
        "rounds": run.rounds,
        "defaults_measured": seeded,
        "new_records": run.have - before,
        "records": run.have,
        "default_latency_ms": default_ms,
        "tuned_latency_ms": tuned_ms,
        "unmeasured_tasks": unmeasured,
        "seconds": round(seconds, 1),
        "seconds_per_trial": round(seconds / max(run.done_trials, 1), 2),
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "budget_s": run.opts.budget_s,
        "db": str(run.db_path),
        "devices": devices,
        "build_timeouts": run.builder.timeouts,
        "not_built_past_budget": run.builder.skipped,
    }


def format_summary(r: dict) -> str:
    """The closing line of `kiln tune`: tasks and how many beat their default, trials, time, the
    estimated latency before and after (sum of the kernels' measured times)."""
    line = (
        f"{r['tasks']} tasks, {r['tasks_faster']} with a record faster than the default "
        f"({r['tasks_searched']} searched): {r['trials']} trials in {r['seconds']} s"
        + (f" of a {r['budget_s']:g} s budget" if r.get("budget_s") else "")
        + (f" ({r['seconds_per_trial']} s/trial)" if r["trials"] else "")
        + f", {r['new_records']} new records, {r['records']} in {r['db']}"
    )
    if r.get("default_latency_ms") is not None:
        d, t = r["default_latency_ms"], r["tuned_latency_ms"]
        line += (
            f"\nestimated latency (sum of the kernels' measured times): {d:.3f} ms with default schedules "
            f"-> {t:.3f} ms with the best records ({d / t:.2f}x)"
        )
        if r.get("unmeasured_tasks"):
            line += (
                f"; {len(r['unmeasured_tasks'])} kernel(s) could not be measured and are left out of both "
                f"(they keep their default schedule): {', '.join(r['unmeasured_tasks'])}"
            )
    else:
        line += (
            "\nestimated latency: unknown (a kernel's default schedule has no measured record in this database, "
            "though a tuned one has: the database was compacted without its ledger of measured defaults)"
        )
    if r.get("records_confirmed") or r.get("records_rejected"):
        line += (
            f"\nmeasured again beside their default schedule: {r['records_confirmed']} best record(s) confirmed "
            f"faster, {r['records_rejected']} slower (not applied)"
        )
    ph = r.get("phase_seconds") or {}
    if ph:
        line += "\ntime: " + ", ".join(f"{k} {v} s" for k, v in ph.items())
    if r.get("build_timeouts"):
        line += f"\n{r['build_timeouts']} candidate(s) killed at the build time limit"
    return line
