"""`kiln tune --target vta-sim`: search each offloaded layer's schedule space (conv.space: output-
channel, row and input-channel tiles, loop order, double buffering) measured by the simulator's
cycle count. The count is deterministic and does not depend on the data (timing-only runs, no
calibration needed), so every candidate is measured once and a database record is final.

The machinery is the CPU path's (kiln/schedules/tuning/tuning.py): TuneOptions (--trials | --budget,
--db), the budget as the command's wall time with a round started only when it fits, the
rounds shared by each workload's share of the model's cycles (pick_tasks), a progress line per
round, the default schedule measured first so a record is never worse than no tuning, and
--compact. The database is one JSON-lines file under DB/<accelerator key>/, keyed by the
accelerator configuration (block and buffer sizes, AXI width, clock, timing model), so a board
preset reuses only its own records; each record is appended and flushed as it is measured (a
kill loses at most the candidate in flight), and a torn last line is dropped with a warning."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ....accel.vta import conv
from ....accel.vta.config import VTAConfig
from ....accel.vta.records import FILE, best_schedules, db_key, load_records
from ....errors import OptionsError
from . import codegen

SAFETY = 1.15  # a round is started only if its estimated time, times this, fits in what is left of the budget


def _sj(s: conv.Schedule) -> str:
    return json.dumps(s.to_json(), sort_keys=True)


def measure(layer: conv.ConvLayer, s: conv.Schedule, cfg: VTAConfig) -> int:
    return codegen.cycles(codegen.compile_conv(layer, cfg, s), cfg).cycles


def estimate(layer: conv.ConvLayer, s: conv.Schedule, cfg: VTAConfig) -> float:
    """A rough cycle estimate (the larger of the compute and the load module's work) that orders
    the candidates, most promising first; only the simulator's count is recorded."""
    d = conv.dims(layer, cfg)
    ot, rt, it = -(-d.ob // s.tco), -(-d.oh // s.th), -(-d.ib // s.tci)
    gemm = d.ob * d.ib * d.kh * d.kw * d.oh * d.ow + d.ob * d.oh * d.ow * 9
    inp = d.ib * conv.rows_in(layer, s.th) * d.x_total * rt * cfg.inp_elem_bytes
    held_inp = it == 1 and s.order == "row"
    wgt = d.ob * d.ib * d.kh * d.kw * cfg.wgt_elem_bytes * (1 if it == 1 and s.order == "oc" else rt)
    load = (inp * (1 if held_inp else ot) + wgt) / cfg.axi_bytes + cfg.dma_latency * ot * rt * it * (s.tci + 1)
    steps = ot * rt * it
    overlap = 1.0 if s.double else 2.0
    return max(gemm, load) + (min(gemm, load) / steps) * overlap + 40 * steps


@dataclasses.dataclass
class Task:
    key: str
    layer: conv.ConvLayer
    names: list[str]  # the model's layers with this workload
    candidates: list[conv.Schedule]
    default: conv.Schedule
    done: set = dataclasses.field(default_factory=set)  # schedules (json) with a record


def shape_layer(layer_like: dict) -> conv.ConvLayer:
    """A layer with the workload's shapes and zero weights (the cycle count ignores values)."""
    o, c = layer_like["out_channels"], layer_like["in"][1]
    kh, kw = layer_like["kernel"]
    zeros = np.zeros(o, np.int32)
    return conv.ConvLayer(
        np.zeros((o, c, kh, kw), np.int8),
        zeros,
        zeros,
        layer_like["relu"],
        tuple(layer_like["in"]),
        tuple(layer_like["stride"]),
        tuple(layer_like["padding"]),
        zeros if layer_like["residual"] else None,
    )


def tune_layers(workloads: dict[str, list[str]], cfg: VTAConfig, db_dir: Path, opts, progress, start: float) -> dict:
    """Tune each workload (key -> the layer names that have it) into db_dir: the defaults measured first, then
    rounds of candidates until the trials or the budget run out."""
    db_dir.mkdir(parents=True, exist_ok=True)
    records = load_records(db_dir)
    before = len(records)
    tasks = _tasks(workloads, cfg, records)
    with (db_dir / FILE).open("a") as out:
        record = _recorder(out, records, cfg)
        default_cycles, seeded = _measure_defaults(tasks, records, record, progress)
        per_task, trials, rounds = _search(tasks, default_cycles, records, record, opts, progress, start)
    best = best_schedules(records)
    return {
        "tasks": len(tasks),
        "layers": sum(len(t.names) for t in tasks),
        "tasks_faster": sum(best[t.key][1] < default_cycles[t.key] for t in tasks),
        "tasks_searched": sum(1 for c in per_task if c),
        "trials": trials,
        "rounds": rounds,
        "defaults_measured": seeded,
        "new_records": len(records) - before,
        "records": len(records),
        "default_cycles": sum(default_cycles[t.key] * len(t.names) for t in tasks),
        "tuned_cycles": sum(best[t.key][1] * len(t.names) for t in tasks),
        "per_workload": {
            t.key: {
                "layers": t.names,
                "default": default_cycles[t.key],
                "best": best[t.key][1],
                "schedule": best[t.key][0].to_json(),
            }
            for t in tasks
        },
        "seconds": round(time.perf_counter() - start, 1),
        "budget_s": opts.budget_s,
        "db": str(db_dir),
    }


def _tasks(workloads: dict[str, list[str]], cfg: VTAConfig, records: list) -> list:
    """A Task per workload: its candidates cheapest-estimate first, the schedules the database already has done."""
    tasks = []
    for key, names in workloads.items():
        layer = shape_layer(json.loads(key))
        default = conv.plan(layer, cfg)
        cands = sorted(conv.space(layer, cfg), key=lambda s, layer=layer: estimate(layer, s, cfg))
        t = Task(key, layer, names, cands, default)
        t.done = {json.dumps(r["schedule"], sort_keys=True) for r in records if r["workload"] == key}
        tasks.append(t)
    return tasks


def _recorder(out, records: list, cfg: VTAConfig):
    """record(task, schedule, is_default) -> cycles: measure it, append the record to the database file and to
    `records`, mark it done."""

    def record(t: Task, s: conv.Schedule, is_default: bool) -> int:
        cyc = measure(t.layer, s, cfg)
        r = {"workload": t.key, "schedule": s.to_json(), "cycles": cyc, "default": is_default, "config": cfg.name}
        out.write(json.dumps(r, sort_keys=True) + "\n")
        out.flush()
        records.append(r)
        t.done.add(_sj(s))
        return cyc

    return record


def _measure_defaults(tasks: list, records: list, record, progress) -> tuple[dict, int]:
    """({workload: its default schedule's cycles}, how many were measured now): the baseline each candidate must
    beat, measured once per database."""
    seeded = 0
    default_cycles = {}
    for t in tasks:
        dj = _sj(t.default)
        known = [r["cycles"] for r in records if r["workload"] == t.key and r["schedule"] == t.default.to_json()]
        default_cycles[t.key] = known[0] if known else record(t, t.default, True)
        seeded += not known
        t.done.add(dj)
    if seeded:
        progress(f"measured the default schedules of {seeded} layer workload(s) new to the database")
    return default_cycles, seeded


def _search(tasks: list, default_cycles: dict, records: list, record, opts, progress, start: float):
    """Rounds of up to trials_per_iter candidates of the task pick_tasks chooses (shares: each workload's cycles),
    until every candidate is measured, --trials are spent or the next round would pass --budget.
    Returns (trials per task, trials, rounds)."""
    from ....schedules.tuning.tuning import pick_tasks

    shares = [default_cycles[t.key] * len(t.names) for t in tasks]
    per_task, trials, rounds, per_trial = [0] * len(tasks), 0, 0, None
    while True:
        elapsed = time.perf_counter() - start
        left = [i for i, t in enumerate(tasks) if any(_sj(s) not in t.done for s in t.candidates)]
        if not left or opts.trials is not None and trials >= opts.trials:
            break
        batch = opts.trials_per_iter
        if opts.budget_s is not None and per_trial is not None and elapsed + 1.15 * batch * per_trial > opts.budget_s:
            progress(f"stopping with {max(0.0, opts.budget_s - elapsed):.0f}s of the budget left")
            break
        (i,) = pick_tasks([shares[j] if j in left else 0.0 for j in range(len(tasks))], per_task, 1)
        t, n = tasks[i], 0
        t0 = time.perf_counter()
        for s in t.candidates:
            if n >= batch or opts.trials is not None and trials >= opts.trials:
                break
            if _sj(s) in t.done:
                continue
            record(t, s, False)
            n, trials = n + 1, trials + 1
        per_task[i] += max(n, 1)
        step = (time.perf_counter() - t0) / max(n, 1)
        per_trial = step if per_trial is None else 0.5 * per_trial + 0.5 * step
        rounds += 1
        progress(_round_line(tasks, default_cycles, records, per_task, trials, rounds, opts, start))
    return per_task, trials, rounds


def _round_line(tasks, default_cycles: dict, records: list, per_task, trials: int, rounds: int, opts, start) -> str:
    """The progress line after a round."""
    best = best_schedules(records)
    faster = sum(best[t.key][1] < default_cycles[t.key] for t in tasks)
    total = sum(best[t.key][1] * len(t.names) for t in tasks)
    elapsed = time.perf_counter() - start
    remain = (
        f"{max(0.0, opts.budget_s - elapsed):.0f}s left"
        if opts.budget_s
        else f"{max(0, opts.trials - trials)} trials left"
    )
    return (
        f"round {rounds}: {sum(1 for c in per_task if c)}/{len(tasks)} layer workloads searched, {faster} "
        f"with a record faster than the default, {trials} trials, {total / 1e6:.3f} M cycles, "
        f"{elapsed:.0f}s elapsed, {remain}"
    )


def tune(model, compile_options, opts, progress: Callable[[str], None] = print) -> dict:
    """`kiln tune` for an accelerator target: the model's offloadable layers, found as `kiln
    compile` finds them, each workload's schedule searched into DB/<db_key>/."""
    from .offload import offload_plan

    start = time.perf_counter()
    cfg = compile_options.target.vta_config()
    workloads = offload_plan(model, compile_options, cfg)
    if not workloads:
        raise OptionsError(
            "the model has no layer the accelerator runs",
            where="kiln tune",
            fix="only conv2d/dense chains (not the first conv) are offloaded; compile it directly",
        )
    return tune_layers(workloads, cfg, Path(opts.db_root) / db_key(cfg), opts, progress, start)


def format_summary(r: dict) -> str:
    return (
        f"{r['tasks']} layer workloads ({r['layers']} layers), {r['tasks_faster']} with a record faster than the "
        f"default ({r['tasks_searched']} searched): {r['trials']} trials in {r['seconds']} s"
        + (f" of a {r['budget_s']:g} s budget" if r.get("budget_s") else "")
        + f", {r['new_records']} new records, {r['records']} in {r['db']}\n"
        f"simulated cycles of the offloaded layers: {r['default_cycles']:,} with the default schedules -> "
        f"{r['tuned_cycles']:,} with the best records ({r['default_cycles'] / max(r['tuned_cycles'], 1):.2f}x)"
    )
