"""kiln tune tells the truth: the budget is the wall time, a kernel whose best record is its default
schedule is not counted as tuned, and the progress lines, the summary and the compile report agree."""

import contextlib
import re
import time

import numpy as np
import pytest
import tvm
from helpers import make_model, rand
from onnx import helper
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.arg_info import ArgInfo

import kiln
from kiln.compiler import CompileOptions
from kiln.compiler.tune import prepare, tune
from kiln.schedules.tuning.baseline import confirm_records, task_times, workload
from kiln.schedules.tuning.builder import WorkerBuilder
from kiln.schedules.tuning.database import open_database, target_key
from kiln.schedules.tuning.measure_args import alloc_measure_args
from kiln.schedules.tuning.tuning import (
    TuneOptions,
    Workers,
    estimated_latency,
    extract,
    format_summary,
    record_default_schedules,
    round_size,
)


@pytest.fixture(scope="module")
def tiny():
    """A 3x3 conv (stride 3: on TVM's schedule on every target; AVX-512's fp32 conv kernel, which MetaSchedule cannot
    tune, takes strides 1 and 2) and its ReLU."""
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1], strides=[3, 3]),
        helper.make_node("Relu", ["c"], ["output"]),
    ]
    return make_model(nodes, {"input": rand(1, 16, 8, 8)}, ["output"], {"w": rand(16, 16, 3, 3, seed=1) * 0.2})


def test_round_size_fits_the_budget():
    b = TuneOptions(budget_s=20, round_trials=16, trials_per_iter=8)
    assert round_size(b, 0, 0.0, 1.0) == 16  # 20 s left: two batches of 8 at 1 s/trial (and a margin)
    assert round_size(b, 0, 8.0, 1.0) == 8  # 12 s left: one batch
    assert round_size(b, 0, 15.0, 1.0) == 0  # 5 s left: a batch would end past the budget, so none starts
    assert round_size(b, 0, 25.0, 0.1) == 0
    t = TuneOptions(trials=20, round_trials=16)
    assert [round_size(t, d, 1e6, 99.0) for d in (0, 16, 20)] == [16, 4, 0]  # --trials ignores the clock


def test_budget_is_the_wall_time(tmp_path, tiny):
    budget = 20.0
    lines = []
    t = time.perf_counter()
    r = tune(tiny, CompileOptions.make(), TuneOptions(db_root=str(tmp_path), budget_s=budget), progress=lines.append)
    wall = time.perf_counter() - t
    assert wall <= budget * 1.1 + 3.0, (wall, r["phase_seconds"], lines)
    assert r["seconds"] <= wall + 0.1
    assert set(r["phase_seconds"]) == {"setup", "tvm_import", "defaults", "search", "other"}
    assert f"of a {budget:g} s budget" in format_summary(r)


@contextlib.contextmanager
def _measuring_defaults(tmp_path, tiny):
    """(tasks, target, database, measure): measure(**kw) records the tasks' default schedules."""
    co = CompileOptions.make()
    mod, target, caps = prepare(tiny, co)
    tasks = extract(mod, target)
    path = tmp_path / target_key(co.target)
    db = open_database(path)
    builder = WorkerBuilder(str(tmp_path))
    try:
        runner = ms.runner.LocalRunner(timeout_sec=30, f_alloc_argument=alloc_measure_args)
        args = (tasks, target, db, builder, runner, caps.f32_block, path, caps.vector_registers)
        measure = lambda **kw: record_default_schedules(*args, **kw)
        measure.confirm = lambda: confirm_records(
            tasks, target, db, path, builder, runner, caps.f32_block, caps.vector_registers
        )
        yield tasks, target, db, measure
    finally:
        builder.close()


def _only_defaults(tmp_path, tiny):
    with _measuring_defaults(tmp_path, tiny) as (tasks, target, db, measure):
        assert measure() == len(tasks) >= 1
    return tasks, target, db


def test_no_default_is_measured_past_the_budget(tmp_path, tiny):
    """Under --budget the defaults phase stops at the builds' deadline (it ran a 20 s budget to 30 s
    on a loaded CI host); what it did not measure waits for the next run, which measures it."""
    with _measuring_defaults(tmp_path, tiny) as (tasks, _, db, measure):
        assert measure(deadline=time.perf_counter()) == 0 and not db.get_all_tuning_records()
        assert measure(deadline=time.perf_counter() + 600) == len(tasks) >= 1


def test_a_kernel_whose_best_record_is_its_default_is_not_tuned(tmp_path, tiny):
    tasks, target, db = _only_defaults(tmp_path, tiny)
    r = kiln.compile(tiny, tmp_path / "d.kiln", tuning_db=str(tmp_path)).report
    assert r["tuned_kernels"] == r["tuned_default_kernels"] == len(tasks) and r["tuned_faster_kernels"] == 0
    assert r["tuned_coverage"] == 0.0  # every record applied is a measured default schedule: nothing is tuned
    for t in tasks:  # a record faster than each default (a trace that schedules nothing, timed 0.1 us)
        mod = workload(t)
        sch = tvm.s_tir.Schedule(mod)
        sch.get_child_blocks(sch.get_sblock("root"))  # (MetaSchedule ignores records with an empty trace)
        db.commit_tuning_record(
            ms.database.TuningRecord(
                sch.trace, db.commit_workload(mod), [1e-7], target, ArgInfo.from_prim_func(mod["main"])
            )
        )
    r = kiln.compile(tiny, tmp_path / "t.kiln", tuning_db=str(tmp_path)).report
    assert r["tuned_faster_kernels"] == r["tuned_kernels"] == len(tasks) and r["tuned_default_kernels"] == 0
    assert r["tuned_coverage"] == 1.0


def _naive_record(db, target, task, secs):
    """A record of the workload's plain loop nest (a trace that schedules nothing: far slower than the
    default schedule) that claims `secs`."""
    mod = workload(task)
    sch = tvm.s_tir.Schedule(mod)
    sch.get_child_blocks(sch.get_sblock("root"))  # (MetaSchedule ignores records with an empty trace)
    db.commit_tuning_record(
        ms.database.TuningRecord(
            sch.trace, db.commit_workload(mod), [secs], target, ArgInfo.from_prim_func(mod["main"])
        )
    )


def test_a_record_slower_than_its_default_when_measured_again_is_not_applied(tmp_path):
    """A default measured once while the machine was busy let a 3x slower Winograd schedule count as
    faster (a detector's tuned build ran 1.2x slower than its default build): kiln tune measures each
    best record again beside its default, and one that loses is never applied."""
    nodes = [helper.make_node("Conv", ["input", "w"], ["output"], pads=[1, 1, 1, 1])]
    # big enough that its plain loop nest is far slower than the default even on a loaded host
    model = make_model(nodes, {"input": rand(1, 64, 56, 56)}, ["output"], {"w": rand(64, 64, 3, 3, seed=1) * 0.2})
    with _measuring_defaults(tmp_path, model) as (tasks, target, db, measure):
        assert measure() == len(tasks)
        (conv,) = [t for t in tasks if "conv2d" in t.task_name]  # (a plain loop nest can win a tiny copy kernel)
        _naive_record(db, target, conv, 1e-7)  # "faster" than the default, as a noisy default once made it look
        path = tmp_path / target_key(CompileOptions.make().target)
        ((d, b),) = task_times([conv], db, path)
        assert b == 1e-7 < d
        assert measure.confirm() == (0, 1)
        assert measure.confirm() == (0, 0)  # the verdict is kept: not measured twice
        ((d, b),) = task_times([conv], db, path)
        assert d == b > 1e-7  # the record applied is the default
    r = kiln.compile(model, tmp_path / "c.kiln", tuning_db=str(tmp_path)).report
    assert r["tuned_faster_kernels"] == 0 and r["tuned_default_kernels"] == r["tuned_kernels"] == len(tasks)


def test_progress_summary_and_compile_report_agree(tmp_path, tiny):
    lines = []
    r = tune(tiny, CompileOptions.make(), TuneOptions(db_root=str(tmp_path), trials=8), progress=lines.append)
    pattern = r"(\d+)/(\d+) tasks searched, (\d+) with a record faster than the default"
    rounds = [m for m in (re.search(pattern, x) for x in lines) if m]
    assert rounds, lines
    searched, tasks, faster = (int(g) for g in rounds[-1].groups())
    assert (tasks, faster, searched) == (r["tasks"], r["tasks_faster"], r["tasks_searched"])
    summary = format_summary(r)
    assert summary.startswith(f"{r['tasks']} tasks, {r['tasks_faster']} with a record faster than the default")
    assert r["default_latency_ms"] > 0 and 0 < r["tuned_latency_ms"] <= r["default_latency_ms"]  # best: never slower
    assert "ms with default schedules ->" in summary
    report = kiln.compile(tiny, tmp_path / "t.kiln", tuning_db=str(tmp_path)).report
    assert report["tuned_faster_kernels"] == r["tasks_faster"]  # one call site per kernel in this model
    assert report["tuned_kernels"] == report["tuned_faster_kernels"] + report["tuned_default_kernels"] == r["tasks"]
    assert (report["tuned_coverage"] > 0) == (r["tasks_faster"] > 0)


def test_estimated_latency_needs_every_default():
    class T:
        weight = 2

        def __init__(self, name="k"):
            self.task_name = name

    d, t, out = estimated_latency([T(), T()], [(1e-3, 5e-4), (2e-3, 2e-3)])
    assert (d, t, out) == (pytest.approx(6.0), pytest.approx(5.0), [])
    assert estimated_latency([T()], [(None, 1e-3)]) == (None, None, [])
    # a kernel no measurement succeeded for keeps its default schedule: left out of both sums, and named
    d, t, out = estimated_latency([T("a"), T("take")], [(1e-3, 5e-4), (None, None)])
    assert (d, t, out) == (pytest.approx(2.0), pytest.approx(1.0), ["take"])


def test_an_embedding_lookup_is_measured_and_the_latency_estimated(tmp_path):
    """MetaSchedule's random integers sent a gather's indices out of its table, every measurement of
    the kernel failed, and a transformer's `kiln tune` ended with "estimated latency: unknown"."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("Add", ["e", "pos"], ["output"]),
    ]
    ids = np.arange(16, dtype=np.int64).reshape(1, 16)
    model = make_model(nodes, {"ids": ids}, ["output"], {"table": rand(4096, 64), "pos": rand(16, 64, seed=1)})
    with _measuring_defaults(tmp_path, model) as (tasks, _, db, measure):
        assert measure() == len(tasks) >= 1
        path = tmp_path / target_key(CompileOptions.make().target)
        d, t, unmeasured = estimated_latency(tasks, task_times(tasks, db, path))
        assert d > 0 and t > 0 and unmeasured == []
    workers = Workers.start(TuneOptions(db_root=str(tmp_path), trials=8))
    try:  # kiln tune's own runner allocates the arguments the same way
        assert workers.local_runner().f_alloc_argument is alloc_measure_args
    finally:
        workers.close()


def test_measured_integers_are_valid_indices():
    dev = tvm.cpu()
    (args,) = alloc_measure_args(dev, [("TENSOR", "int64", [64]), ("TENSOR", "float32", [64])], 1)
    assert not args[0].numpy().any()  # zero: an index into any table
    assert np.count_nonzero(args[1].numpy()) > 32  # floats keep MetaSchedule's random fill


def test_no_build_starts_past_the_deadline(tmp_path):
    """BudgetBuilder, the backstop when a round's estimate was wrong: past its deadline every
    candidate is a failed build at once (no worker is started, nothing compiles)."""
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from kiln.schedules.tuning.workers import BudgetBuilder

    b = BudgetBuilder(str(tmp_path))
    b.deadline = time.perf_counter() - 1
    mod = tvm.IRModule()
    results = b.build([BuilderInput(mod, tvm.target.Target("llvm"))] * 3)
    assert [r.error_msg for r in results] == ["not built: the --budget is spent"] * 3 and b.skipped == 3
    assert b._proc is None
    b.close()
