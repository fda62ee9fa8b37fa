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


def parse_tracker(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionsError(
            f"bad RPC tracker address {text!r}", where="--rpc-tracker", fix="write it as HOST:PORT, e.g. 127.0.0.1:9190"
        )
    return host, int(port)


RPC_CANDIDATE_TIMEOUT_S = 30  # one remote candidate: get a device, upload, run; past it the candidate fails


def rpc_runner(opts: TuneOptions):
    """MetaSchedule's RPC runner on the tracker's devices with this key, as many in parallel as
    are free (or rpc_workers). A device that dies mid-run fails only the candidates it held."""
    import socket

    from tvm import rpc
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig, RPCRunner
    from tvm.support.popen_pool import PopenPoolExecutor

    host, port = parse_tracker(opts.rpc_tracker)
    try:
        socket.create_connection((host, port), timeout=5).close()  # TVM's own client retries for a minute
        summary = rpc.connect_tracker(host, port).summary()
    except Exception as e:
        raise OptionsError(
            f"cannot reach the RPC tracker at {host}:{port}: {type(e).__name__}",
            where="--rpc-tracker",
            fix="start it: python -m tvm.exec.rpc_tracker --host HOST --port PORT",
        ) from None
    free = summary.get("queue_info", {}).get(opts.rpc_key, {}).get("free", 0)
    if not free:
        raise OptionsError(
            f"no free device with key {opts.rpc_key!r} at the tracker {host}:{port}",
            where="--rpc-key",
            fix=f"start one: python -m tvm.exec.rpc_server --tracker {host}:{port} --key {opts.rpc_key}",
        )
    workers = opts.rpc_workers or free
    runner = RPCRunner(
        RPCConfig(
            tracker_host=host,
            tracker_port=port,
            tracker_key=opts.rpc_key,
            session_timeout_sec=RPC_CANDIDATE_TIMEOUT_S,
            session_priority=1,
        ),
        EvaluatorConfig(number=3, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False),
        max_workers=workers,
    )
    # MetaSchedule waits on each candidate's worker with no time limit: a worker whose tracker request never
    # gets a device (a server that died holding its slot, seen in tests) blocked the whole run for good. The
    # pool's own timeout kills such a worker, and the candidate fails with RPCRunner's "Timeout" result.
    runner.pool.shutdown(wait=False)
    runner.pool = PopenPoolExecutor(max_workers=workers, timeout=RPC_CANDIDATE_TIMEOUT_S)
    return runner, free


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
    before = have = len(db.get_all_tuning_records())
    total = opts.trials
    done_trials, rounds = 0, 0
    shares, per_task, empty = latency_shares(tasks), [0] * len(tasks), 0
    workers = workers or Workers.start(opts)
    runner, devices = rpc_runner(opts) if opts.rpc_tracker else (None, 1)
    if opts.rpc_tracker:
        progress(
            f"measuring on {opts.rpc_workers or devices} device(s) with key {opts.rpc_key!r} at {opts.rpc_tracker}"
        )
    t = time.perf_counter()
    import_tensor_intrinsics(target.kind.name)  # before the budget sizes any round, not inside the first one
    phases = {"setup": t - start, "tvm_import": time.perf_counter() - t}
    search_s, per_trial = 0.0, FIRST_TRIAL_GUESS_S
    checks = [0, 0]  # best records confirmed / rejected when measured again beside their default
    with (
        tempfile.TemporaryDirectory(prefix="kiln-tune-", ignore_cleanup_errors=True) as tmp,
        contextlib.closing(workers),
    ):  # closing: stops the worker process
        builder = workers.builder
        builder.out_dir = tmp
        builder.start()  # here, so a worker that cannot start is a ResourceError, not an error inside MetaSchedule
        runner = runner or workers.local_runner()
        t = time.perf_counter()
        # under --budget the biggest kernels' defaults first, and none started past the builds' deadline
        order = sorted(range(len(tasks)), key=lambda i: -shares[i]) if opts.budget_s is not None else range(len(tasks))
        deadline = start + opts.budget_s - BUDGET_RESERVE_S if opts.budget_s is not None else None
        seeded = record_default_schedules(
            [tasks[i] for i in order], target, db, builder, runner, lanes, db_path, registers, deadline
        )
        phases["defaults"] = time.perf_counter() - t
        if deadline is not None and time.perf_counter() >= deadline:
            progress(
                f"the --budget ran out measuring the default schedules ({seeded} measured): the next run measures "
                "the rest before it searches"
            )
        if seeded:
            # one build + one measurement each, like a trial, which also runs the search and the cost model
            per_trial = max(per_trial, FIRST_ROUND_FACTOR * phases["defaults"] / seeded)
            have = len(db.get_all_tuning_records())
            progress(
                f"measured the default schedules of {seeded} kernel(s) new to the database: "
                "the baseline each candidate must beat "
                f"({time.perf_counter() - start:.0f}s)"
            )
        while True:
            elapsed = time.perf_counter() - start
            n = round_size(opts, done_trials, elapsed, per_trial)
            if opts.budget_s is not None:  # set after the defaults: the baseline is always measured
                reserve = max(BUDGET_RESERVE_S, POST_BUILD_SHARE * per_trial * opts.trials_per_iter)
                builder.deadline = start + opts.budget_s - reserve
            if opts.budget_s is not None and not rounds:
                n = min(n, opts.trials_per_iter)  # one batch first: what it costs sizes the later rounds
            if n <= 0:
                if opts.budget_s is not None and (total is None):
                    progress(
                        f"stopping with {max(0.0, opts.budget_s - elapsed):.0f}s of the budget left: a batch of "
                        f"{opts.trials_per_iter} trials is estimated at {per_trial * opts.trials_per_iter:.0f}s"
                    )
                break
            # each round tunes the tasks with the most estimated latency per trial so far: a fresh
            # MetaSchedule task scheduler per round would otherwise start at task 0 every time
            chosen = pick_tasks(shares, per_task, max(1, n // opts.trials_per_iter))
            ctxs, weights = _contexts([tasks[i] for i in chosen], opts, opts.seed + rounds)
            for i in chosen:
                per_task[i] += opts.trials_per_iter
            t = time.perf_counter()
            # max_trials_global counts this call's trials
            ms.tune.tune_tasks(
                tasks=ctxs,
                task_weights=weights,
                work_dir=str(db_path),
                max_trials_global=n,
                max_trials_per_task=None,
                num_trials_per_iter=opts.trials_per_iter,
                builder=builder,
                runner=runner,
                database=db,
                cost_model="xgb",
            )
            now = len(db.get_all_tuning_records())
            measured = now - have
            ok, lost = confirm_records(
                [tasks[i] for i in chosen], target, db, db_path, builder, runner, lanes, registers, builder.deadline
            )
            checks[0], checks[1] = checks[0] + ok, checks[1] + lost
            have = len(db.get_all_tuning_records())
            rounds += 1
            done_trials += max(measured, 1)  # a round that finds nothing new still counts, so we terminate
            search_s += time.perf_counter() - t
            per_trial = search_s / done_trials  # a round's whole cost (search, cost model, builds, runs) per trial
            elapsed = time.perf_counter() - start
            left = (
                f"{max(0.0, opts.budget_s - elapsed):.0f}s left"
                if opts.budget_s
                else f"{max(0, total - done_trials)} trials left"
            )
            searched = sum(1 for c in per_task if c)
            faster = faster_than_default(task_times(tasks, db, db_path))
            progress(
                f"round {rounds}: {searched}/{len(tasks)} tasks searched, {faster} with a record faster than the "
                f"default, {done_trials} trials, {per_trial:.2f} s/trial, {elapsed:.0f}s elapsed, {left}"
            )
            empty = 0 if measured else empty + 1
            if empty >= -(-len(tasks) // max(1, n // opts.trials_per_iter)):  # a whole rotation found nothing new
                break
    phases["search"] = search_s
    times = task_times(tasks, db, db_path)
    default_ms, tuned_ms, unmeasured = estimated_latency(tasks, times)
    seconds = time.perf_counter() - start
    phases["other"] = max(0.0, seconds - sum(phases.values()))  # worker start, runner check, database reads
    return {
        "tasks": len(tasks),
        "tasks_searched": sum(1 for c in per_task if c),
        "tasks_faster": faster_than_default(times),
        "trials": done_trials,
        "records_confirmed": checks[0],
        "records_rejected": checks[1],
        "rounds": rounds,
        "defaults_measured": seeded,
        "new_records": have - before,
        "records": have,
        "default_latency_ms": default_ms,
        "tuned_latency_ms": tuned_ms,
        "unmeasured_tasks": unmeasured,
        "seconds": round(seconds, 1),
        "seconds_per_trial": round(seconds / max(done_trials, 1), 2),
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "budget_s": opts.budget_s,
        "db": str(db_path),
        "devices": devices,
        "build_timeouts": builder.timeouts,
        "not_built_past_budget": builder.skipped,
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
