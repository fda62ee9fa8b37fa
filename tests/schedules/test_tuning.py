"""Tuning: a tiny model for a few trials, resuming, surviving a kill, a corrupt line, applying."""

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln
from kiln.compiler import CompileOptions
from kiln.compiler.tune import tune
from kiln.schedules.tuning.database import FILES, open_database, target_key
from kiln.schedules.tuning.tuning import TuneOptions, parse_duration


@pytest.fixture(scope="module")
def tiny():
    x = rand(1, 16, 8, 8)
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["output"]),
    ]
    return make_model(nodes, {"input": x}, ["output"], {"w": rand(16, 16, 3, 3, seed=1) * 0.2})


@pytest.fixture(scope="module")
def first_tune(tmp_path_factory, tiny):
    """A 2-trial tune of `tiny` into a new database, made once: (database root, result, progress lines)."""
    root, lines = tmp_path_factory.mktemp("tuned2"), []
    r = tune(tiny, CompileOptions.make(), TuneOptions(db_root=str(root), trials=2), progress=lines.append)
    return root, r, lines


@pytest.fixture(scope="module")
def tuned_twice(first_tune):
    """The database of first_tune, for the tests that only read or damage one: each copies it (`_copy_db`)."""
    return first_tune[0]


def _copy_db(src, dst):
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def _records(db):
    return len(open_database(db).get_all_tuning_records())


def test_tune_resume_and_apply(tmp_path, tiny, first_tune):
    co = CompileOptions.make()
    root, r, lines = first_tune
    assert r["db"] == str(root / target_key(co.target)) and r["new_records"] >= 2
    assert (
        r["defaults_measured"] == r["tasks"] and "default schedules of" in lines[0]
    )  # the baseline, once per workload
    assert lines and "trials" in lines[-1] and "s/trial" in lines[-1]
    db = _copy_db(root, tmp_path) / target_key(co.target)
    assert all((db / f).exists() for f in FILES)
    lines = []
    first = _records(db)
    r2 = tune(tiny, co, TuneOptions(db_root=str(tmp_path), trials=4), progress=lines.append)
    assert _records(db) == first + r2["new_records"] and 1 <= r2["new_records"] <= 8  # continues, keeps the old records
    assert (
        r2["trials"] <= 8 and r2["defaults_measured"] == 0
    )  # asked for 4; MetaSchedule measures in batches of up to 8
    out = kiln.compile(tiny, tmp_path / "t.kiln", tuning_db=str(tmp_path))
    rep = out.report  # records applied: each beat its default or is that default (tuned_coverage counts the first)
    assert rep["tuned_kernels"] == rep["tuned_faster_kernels"] + rep["tuned_default_kernels"] >= 1
    assert 0 <= rep["tuned_coverage"] <= 1
    assert out.manifest["compile_options"]["tuning_db_sha256"]
    x = rand(1, 16, 8, 8, seed=3)
    np.testing.assert_allclose(
        kiln.load(tmp_path / "t.kiln").run({"input": x})["output"], ort_run(tiny, {"input": x})[0], rtol=1e-4, atol=1e-4
    )


def test_killed_tuning_leaves_a_database_that_loads_and_resumes(tmp_path, tiny):
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny, model)
    cmd = [sys.executable, "-m", "kiln", "tune", str(model), "--trials", "200", "--db", str(tmp_path / "db")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 120
    line = ""
    while time.time() < deadline and "measured the default schedules" not in line:  # killed in round 1
        line = p.stdout.readline()
        if not line and p.poll() is not None:
            break
    time.sleep(1.5)
    assert p.poll() is None, "tuning ended before it could be killed"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    db = tmp_path / "db" / target_key(CompileOptions.make().target)
    n = _records(db)
    assert n >= 1
    r = tune(tiny, CompileOptions.make(), TuneOptions(db_root=str(tmp_path / "db"), trials=2), progress=lambda s: None)
    assert _records(db) == n + r["new_records"]


def test_corrupt_line_is_skipped_with_a_warning(tmp_path, tuned_twice):
    co = CompileOptions.make()
    _copy_db(tuned_twice, tmp_path)
    db = tmp_path / target_key(co.target)
    n = _records(db)
    with open(db / FILES[1], "a") as f:
        f.write('[0, {"torn": ')  # what a kill mid-write leaves
    with pytest.warns(UserWarning, match="skipping 1 corrupt line"):
        assert len(open_database(db).get_all_tuning_records()) == n


def test_records_measured_against_an_older_default_rule_are_not_applied(tmp_path, tiny, tuned_twice):
    """A database whose ledger of measured defaults holds none of today's default schedules (the rules
    improved since it was tuned: the shipped AVX2 records replayed the 8-pixel conv tile, ResNet-50 1.55x
    slower on Zen 3): neither its default records nor the records that beat them are applied, the kernels
    take today's rules, and the report counts them as stale."""
    import json

    from kiln.schedules.tuning.database import DEFAULTS

    co = CompileOptions.make()
    _copy_db(tuned_twice, tmp_path)
    db = tmp_path / target_key(co.target)
    ledger = json.loads((db / DEFAULTS).read_text())
    (db / DEFAULTS).write_text(json.dumps({k: ["0" * 16] for k in ledger}))
    fresh = kiln.compile(tiny, tmp_path / "t.kiln", tuning_db=str(tmp_path)).report
    assert fresh["tuned_faster_kernels"] == 0 and fresh["tuned_coverage"] == 0.0
    assert fresh["stale_records"] >= 1 and fresh["tuned_default_kernels"] == fresh["tuned_kernels"] >= 1


def test_a_record_tvm_cannot_read_back_is_dropped_not_the_database(tmp_path, tiny, tuned_twice):
    """A well-formed line whose trace TVM refuses (a ResNet-50 bf16 run wrote 9 such, and every later
    open of the database failed): it is dropped with a warning, the other records load and compile."""
    co = CompileOptions.make()
    _copy_db(tuned_twice, tmp_path)
    db = tmp_path / target_key(co.target)
    n = _records(db)
    lines = (db / FILES[1]).read_text().splitlines()
    bad = next(line for line in lines if '"GetSBlock",[],["' in line)
    bad = bad.replace('"GetSBlock",[],["', '"GetSBlock",[],["no_such_block_', 1)
    with open(db / FILES[1], "a") as f:
        f.write(bad + "\n")
    with pytest.warns(UserWarning, match="dropping 1 record"):
        assert len(open_database(db).get_all_tuning_records()) == n
    assert (db / FILES[1]).read_text().splitlines() == lines  # rewritten without it
    assert kiln.compile(tiny, tmp_path / "t.kiln", tuning_db=str(tmp_path)).report["tuned_kernels"] >= 1


def test_options_and_errors(tmp_path, tiny):
    assert parse_duration("20m") == 1200 and parse_duration("1.5h") == 5400 and parse_duration("90") == 90
    with pytest.raises(kiln.OptionsError, match="bad duration"):
        parse_duration("soon")
    with pytest.raises(kiln.OptionsError, match="exactly one of"):
        TuneOptions(trials=4, budget_s=10)
    with pytest.raises(kiln.OptionsError, match="no tuning records for target") as e:
        kiln.compile(tiny, tmp_path / "x.kiln", tuning_db=str(tmp_path))
    assert "kiln tune" in str(e.value)


@pytest.mark.slow
def test_twenty_random_kills_leave_a_readable_database(tmp_path, tiny):
    """SIGKILL `kiln tune` 8 times over one database (KILN_KILLS=20 for a longer stress run): a quarter of
    the kills during start-up, the rest at a random moment (0-4 s) after the run's first new records
    reach the file, i.e. while it searches, measures and appends. After every kill the database loads,
    and no record that was in it is ever lost. (A run spends ~25 s here before its first records: 20
    kills made this the suite's longest test, several minutes of one worker.)"""
    import random
    import warnings

    model = tmp_path / "tiny.onnx"
    onnx.save(tiny, model)
    db = tmp_path / "db" / target_key(CompileOptions.make().target)
    rng = random.Random(20)
    counts, unreadable, repaired, kills = [0], 0, 0, int(os.environ.get("KILN_KILLS", 8))

    def size():
        f = db / FILES[1]
        return f.stat().st_size if f.exists() else 0

    for i in range(kills):
        cmd = [sys.executable, "-m", "kiln", "tune", str(model), "--trials", "500", "--db", str(tmp_path / "db")]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        if i % 4 == 0:
            time.sleep(rng.uniform(0.5, 10.0))  # start-up: import, task extraction, first search
        else:
            before, deadline = size(), time.time() + 90
            while size() == before and time.time() < deadline and p.poll() is None:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 4.0))
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        try:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                n = _records(db) if (db / FILES[0]).exists() else 0
            repaired += any("corrupt line" in str(x.message) for x in w)
        except Exception:
            unreadable += 1
            continue
        counts.append(n)
    print(
        f"kills: {kills}, unreadable: {unreadable}, torn lines repaired: {repaired}, "
        f"records after each kill: {counts[1:]}"
    )
    assert unreadable == 0
    assert counts == sorted(counts) and counts[-1] > 0  # records only ever grow


def test_tune_a_bf16_build(tmp_path, tiny):
    """kiln tune --precision bf16 tunes the kernels `kiln compile --precision bf16` builds (here the 3x3
    conv at 16x16 on Winograd F(4x4) with bf16 weights; the 1x1 conv after it, on the vdpbf16ps C
    kernel where the CPU has AVX512-BF16, comes scheduled and is no task), and that compile applies
    them; a float32 build has other kernels. On the host without AMX: on AMX-BF16 both convs take the
    tile kernel and there is nothing to tune."""
    from helpers import host_without_amx

    from kiln.cli import build_parser

    assert build_parser().parse_args(["tune", "m.onnx", "--trials", "2", "--precision", "bf16"]).precision == "bf16"
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["output"]),
    ]
    m = make_model(
        nodes,
        {"input": rand(1, 16, 16, 16)},
        ["output"],
        {"w": rand(16, 16, 3, 3, seed=1) * 0.2, "w2": rand(32, 16, 1, 1, seed=2) * 0.2},
    )
    host = host_without_amx()
    r = tune(
        m,
        CompileOptions.make(target=host, precision="bf16"),
        TuneOptions(db_root=str(tmp_path), trials=2),
        progress=lambda s: None,
    )
    assert r["new_records"] >= r["tasks"] >= 1
    out = kiln.compile(m, tmp_path / "t.kiln", target=host, tuning_db=str(tmp_path), precision="bf16")
    rep = out.report  # every task's kernel runs a record: one that beat its default schedule, or that default
    assert rep["winograd_convs"] == 1
    assert rep["tuned_kernels"] == rep["tuned_faster_kernels"] + rep["tuned_default_kernels"] == r["tasks"]
    assert out.report["bf16_kernel_convs"] == (1 if "avx512bf16" in out.manifest["cpu_features"] else 0)
    assert kiln.compile(m, tmp_path / "f.kiln", target=host, tuning_db=str(tmp_path)).report["tuned_coverage"] == 0.0
    x = rand(1, 16, 16, 16, seed=3)
    ref = ort_run(m, {"input": x})[0]
    np.testing.assert_allclose(
        kiln.load(tmp_path / "t.kiln").run({"input": x})["output"], ref, rtol=4e-2, atol=4e-2 * np.abs(ref).max()
    )


def test_shipped_records_apply_by_default_and_none_disables(tmp_path, tiny, tuned_twice, monkeypatch):
    _copy_db(tuned_twice, tmp_path / "shipped")
    monkeypatch.setenv("KILN_TUNING_LOGS", str(tmp_path / "shipped"))
    r = kiln.compile(tiny, tmp_path / "a.kiln")  # no --tuning-db: the shipped records for this target
    assert r.report["tuned_kernels"] >= 1 and r.manifest["compile_options"]["tuning_db"].startswith(
        str(tmp_path / "shipped")
    )
    r = kiln.compile(tiny, tmp_path / "b.kiln", tuning_db="none")
    assert r.report.get("tuned_kernels", 0) == 0 and r.manifest["compile_options"]["tuning_db"] is None
    monkeypatch.setenv("KILN_TUNING_LOGS", str(tmp_path / "nothing"))  # another machine: no records for its key
    assert kiln.compile(tiny, tmp_path / "c.kiln").manifest["compile_options"]["tuning_db"] is None


def test_compact_keeps_the_best_record_per_workload(tmp_path, tiny, tuned_twice):
    from kiln.schedules.tuning.database import compact

    co = CompileOptions.make()
    _copy_db(tuned_twice, tmp_path)  # each task's measured default, and the searched task's 2 candidates
    db = tmp_path / target_key(co.target)
    full = kiln.compile(tiny, tmp_path / "full.kiln", tuning_db=str(tmp_path))
    before, after = compact(db)
    assert before > after and 1 <= after <= 3 and _records(db) == after  # one per task
    small = kiln.compile(tiny, tmp_path / "small.kiln", tuning_db=str(tmp_path))
    assert small.report["tuned_kernels"] == full.report["tuned_kernels"] >= 1
    x = rand(1, 16, 8, 8, seed=4)
    np.testing.assert_allclose(
        kiln.load(tmp_path / "small.kiln").run({"input": x})["output"],
        ort_run(tiny, {"input": x})[0],
        rtol=1e-4,
        atol=1e-4,
    )


def test_rounds_cover_every_task_then_follow_estimated_latency():
    from kiln.schedules.tuning.tuning import pick_tasks

    shares, done = [0.6, 0.3, 0.05, 0.05], [0, 0, 0, 0]
    seen = []
    for _ in range(2):  # two tasks per round: every task once before any twice
        chosen = pick_tasks(shares, done, 2)
        seen += chosen
        for i in chosen:
            done[i] += 8
    assert sorted(seen) == [0, 1, 2, 3]
    for _ in range(6):
        for i in pick_tasks(shares, done, 1):
            done[i] += 8
    assert done[0] > done[1] > done[2] and done[2] == done[3] == 8  # then by share of the latency


def test_recorded_default_schedule_replays_to_the_default(tmp_path, tiny):
    """Each workload's first record is its default schedule, measured: the database's best record
    is never a schedule slower than the default (as measured), and replaying that record gives
    exactly the schedule DefaultSchedules would."""
    import dataclasses

    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from kiln.compiler.backends import CPU
    from kiln.compiler.optimize import optimize
    from kiln.frontends.importer import import_onnx
    from kiln.schedules.rules.apply import first_rule_that_applies
    from kiln.schedules.tuning.baseline import workload
    from kiln.schedules.tuning.builder import WorkerBuilder
    from kiln.schedules.tuning.tuning import extract, record_default_schedules

    co = CompileOptions.make()
    co = dataclasses.replace(co, disabled_passes=(CPU.schedule_row,))
    mod = optimize(import_onnx(tiny, co.shapes).mod, co).mod
    target = co.target.tvm()
    tasks = extract(mod, target)
    db = open_database(tmp_path / "db")
    builder = WorkerBuilder(str(tmp_path))
    assert (
        record_default_schedules(tasks, target, db, builder, ms.runner.LocalRunner(timeout_sec=30), 16)
        == len(tasks)
        >= 1
    )
    assert record_default_schedules(tasks, target, db, builder, ms.runner.LocalRunner(timeout_sec=30), 16) == 0
    for t in tasks:
        (rec,) = db.get_top_k(db.commit_workload(workload(t)), 1)  # the database keys on the stripped kernel
        assert rec.run_secs and all(float(s) > 0 for s in rec.run_secs)
        replayed = tvm.s_tir.Schedule(t.dispatched[0])
        rec.trace.apply_to_schedule(replayed, remove_postproc=False)
        _, default = first_rule_that_applies(t.dispatched[0]["main"], "cpu", 16)
        assert tvm_ffi.structural_equal(replayed.mod, default.mod)
    # a fresh process reads them back from the files
    assert len(open_database(tmp_path / "db").get_all_tuning_records()) == len(tasks)

    # a default rule that changed since (here: one more traced step) is measured again
    from kiln.schedules.rules import apply

    def changed_rule(func, family, lanes, registers=16):
        kind, sch = first_rule_that_applies(func, family, lanes, registers)
        if sch is not None:
            sch.get_child_blocks(sch.get_sblock("root"))
        return kind, sch

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(apply, "first_rule_that_applies", changed_rule)
        assert record_default_schedules(tasks, target, db, builder, ms.runner.LocalRunner(timeout_sec=30), 16) == len(
            tasks
        )
    builder.close()


def test_compacted_database_does_not_measure_its_defaults_again(tmp_path, tiny):
    """Compaction keeps each workload's best record only; when a tuned one beat the default, the
    default's record goes, and the database's ledger of measured defaults is what keeps the next run
    from measuring it again (without the ledger it would)."""
    import dataclasses

    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from kiln.compiler.backends import CPU
    from kiln.compiler.optimize import optimize
    from kiln.frontends.importer import import_onnx
    from kiln.schedules.tuning.baseline import workload
    from kiln.schedules.tuning.builder import WorkerBuilder
    from kiln.schedules.tuning.database import DEFAULTS, compact
    from kiln.schedules.tuning.tuning import extract, record_default_schedules

    co = dataclasses.replace(CompileOptions.make(), disabled_passes=(CPU.schedule_row,))
    tasks = extract(optimize(import_onnx(tiny, co.shapes).mod, co).mod, co.target.tvm())
    target, path, builder, runner = (
        co.target.tvm(),
        tmp_path / "db",
        WorkerBuilder(str(tmp_path)),
        ms.runner.LocalRunner(timeout_sec=30),
    )
    db = open_database(path)
    assert record_default_schedules(tasks, target, db, builder, runner, 16, path) == len(tasks) >= 1
    assert (path / DEFAULTS).exists()
    for t in (
        tasks
    ):  # a faster record of each workload (a trace that schedules nothing, timed 0.1 us): compaction keeps only it
        mod = workload(t)
        sch = tvm.s_tir.Schedule(mod)
        sch.get_child_blocks(sch.get_sblock("root"))  # (MetaSchedule ignores records with an empty trace)
        db.commit_tuning_record(
            ms.database.TuningRecord(
                sch.trace, db.commit_workload(mod), [1e-7], target, ArgInfo.from_prim_func(mod["main"])
            )
        )
    compact(path)
    db = open_database(path)
    assert len(db.get_all_tuning_records()) == len(tasks)  # the default records are gone
    assert record_default_schedules(tasks, target, db, builder, runner, 16, path) == 0  # the ledger remembers them
    assert record_default_schedules(tasks, target, db, builder, runner, 16) == len(tasks)  # without it: measured again
    builder.close()


def slow_when_flagged(mod_json, target, out_dir):
    """A build (run in the builder's worker process) that never finishes while out_dir/slow exists."""
    import os
    import time

    from kiln.schedules.tuning.builder import compile_candidate

    while os.path.exists(os.path.join(out_dir, "slow")):
        time.sleep(0.1)
    return compile_candidate(mod_json, target, out_dir)


def test_a_runaway_build_is_killed_and_the_next_one_builds(tmp_path):
    """A candidate whose compile does not finish within the builder's limit is a failed build (its
    worker killed), not a hung tuning run; the next candidate gets a fresh worker and builds."""
    import time
    from pathlib import Path

    import tvm
    from tvm import te
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from kiln.schedules.tuning.builder import WorkerBuilder

    a = te.placeholder((16,), name="a")
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((16,), lambda i: a[i] + 1.0, name="b")])})
    target = tvm.target.Target({"kind": "llvm"})
    builder = WorkerBuilder(str(tmp_path), timeout_s=2, build=slow_when_flagged)
    (tmp_path / "slow").write_text("")
    t = time.perf_counter()
    (hung,) = builder.build([BuilderInput(mod, target)])
    assert hung.artifact_path is None and "timed out after 2 s" in hung.error_msg and builder.timeouts == 1
    assert time.perf_counter() - t < 60  # the worker's start-up plus the 2 s limit, not the endless build
    (tmp_path / "slow").unlink()
    (ok,) = builder.build([BuilderInput(mod, target)])
    assert ok.error_msg is None and Path(ok.artifact_path).stat().st_size > 0
    builder.close()


def test_the_shipped_tuning_logs_load():
    """Every target folder Kiln ships in tuning_logs/ is a database that loads, one record per
    workload (compacted), each with a measured time; named by a target key."""
    from kiln.env import SHIPPED_TUNING_LOGS

    folders = [d for d in SHIPPED_TUNING_LOGS.iterdir() if d.is_dir()]
    assert folders, "Kiln ships tuning records for at least the machine they were made on"
    for d in folders:
        assert d.name.startswith("llvm-") and all((d / f).exists() for f in FILES)
        records = open_database(d).get_all_tuning_records()
        import tvm_ffi

        workloads = {tvm_ffi.structural_hash(r.workload.mod) for r in records}
        assert len(records) == len(workloads) >= 1
        assert all(r.run_secs and float(r.run_secs[0]) > 0 for r in records)
        from kiln.schedules.tuning.database import measured_defaults

        ledger = measured_defaults(d)  # the defaults measured into it: a tune run here does not measure them again
        assert ledger and len({str(h) for h in workloads} & set(ledger)) >= len(ledger) // 2


def test_a_build_worker_that_does_not_start_is_a_clear_error(tmp_path, monkeypatch):
    """The worker must answer within START_TIMEOUT_S: when it does not, starting it is a
    ResourceError (kiln tune starts it before MetaSchedule does, so the user sees that error), and
    a restart that fails inside MetaSchedule's build call is a failed candidate, not an exception."""
    import tvm
    from tvm import te
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from kiln.errors import ResourceError
    from kiln.schedules.tuning import builder as b

    monkeypatch.setattr(b, "START_TIMEOUT_S", 0.0)
    worker = b.WorkerBuilder(str(tmp_path))
    with pytest.raises(ResourceError, match="build worker process did not start") as e:
        worker.start()
    assert e.value.where == "kiln tune" and worker._proc is None
    a = te.placeholder((16,), name="a")
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((16,), lambda i: a[i] + 1.0, name="b")])})
    (result,) = worker.build([BuilderInput(mod, tvm.target.Target({"kind": "llvm"}))])
    assert result.artifact_path is None and "did not start" in result.error_msg


def test_run_time_sized_kernels_are_not_tuned():
    """A kernel sized at run time (NonZero's output, as a detector's post-NMS boxes) or with a scalar
    argument (a TopK's k) is no tuning task: the static rules cannot size it and MetaSchedule's runner
    cannot make its arguments (ssdlite320 ended `kiln tune` with an internal error: the defaults phase measures
    every extracted task). The conv is a task."""
    from kiln.compiler.tune import prepare
    from kiln.schedules.tuning.tuning import extract

    x = rand(1, 16, 8, 8)
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["output"]),
        helper.make_node("NonZero", ["output"], ["nz"]),
        helper.make_node("Add", ["nz", "one"], ["where"]),
    ]
    inits = {"w": rand(16, 16, 3, 3, seed=1) * 0.2, "one": np.array(1, np.int64)}
    model = make_model(nodes, {"input": x}, ["output", "where"], inits)
    co = CompileOptions.make()
    mod, target, _ = prepare(model, co)
    tasks = extract(mod, target)
    assert tasks and all("add" not in t.task_name and "nonzero" not in t.task_name for t in tasks), [
        t.task_name for t in tasks
    ]
