"""`kiln tune --target vta-sim`: a few trials on a two-layer model find schedules with fewer
simulated cycles than the default heuristic, the database resumes after a kill (a torn last line
is dropped, measured candidates are not measured again), records are keyed by the accelerator
configuration, and `kiln compile --tuning-db` applies them (the report has both cycle counts)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import make_model
from onnx import helper

import kiln
from kiln.accel.vta import records as vta_tune
from kiln.accel.vta.config import VTAConfig
from kiln.cli import main


@pytest.fixture(scope="module")
def two_layers(tmp_path_factory):
    """conv0 (the first conv, CPU) -> conv1 (48->96, 3x3) -> conv2 (96->64, 3x3 stride 2): two offloaded layers."""
    tmp = tmp_path_factory.mktemp("vtatune")
    rng = np.random.default_rng(4)
    inits = {
        "w0": (rng.standard_normal((48, 3, 3, 3)) * 0.3).astype(np.float32),
        "w1": (rng.standard_normal((96, 48, 3, 3)) * 0.05).astype(np.float32),
        "b1": (rng.standard_normal(96) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((64, 96, 3, 3)) * 0.05).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["input", "w0"], ["c0"], pads=[1] * 4, name="conv0"),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1] * 4, name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4, strides=[2, 2], name="conv2"),
        helper.make_node("Relu", ["c2"], ["output"]),
    ]
    x = rng.standard_normal((1, 3, 20, 20)).astype(np.float32)
    model = make_model(nodes, {"input": x}, ["output"], inits)
    import onnx

    onnx.save(model, tmp / "m.onnx")
    np.savez(tmp / "c.npz", input=rng.standard_normal((4, 3, 20, 20)).astype(np.float32))
    return tmp, x


def _cmd(tmp, db, *extra):
    return [
        "tune",
        str(tmp / "m.onnx"),
        "--target",
        "vta-sim",
        "--quantize",
        "int8",
        "--calibration",
        str(tmp / "c.npz"),
        "--db",
        str(db),
        *extra,
    ]


def test_a_few_trials_beat_the_default_and_compile_applies_them(two_layers, capsys):
    tmp, x = two_layers
    db = tmp / "db"
    assert main(_cmd(tmp, db, "--trials", "12")) == 0
    out = capsys.readouterr().out
    assert "round 1:" in out and "with the best records" in out
    key = vta_tune.db_key(VTAConfig.parse())
    records = vta_tune.load_records(db / key)
    assert len(records) == 2 + 12  # the two defaults, then 12 trials, each measured once
    assert len({(r["workload"], json.dumps(r["schedule"], sort_keys=True)) for r in records}) == len(records)
    by_wl = {}
    for r in records:
        by_wl.setdefault(r["workload"], []).append(r)
    assert len(by_wl) == 2
    for rs in by_wl.values():
        default = next(r["cycles"] for r in rs if r["default"])
        assert min(r["cycles"] for r in rs) < default  # the search found a faster schedule for each layer
    # compile with the records: the report has the default and the tuned cycles per layer
    r = kiln.compile(
        tmp / "m.onnx",
        tmp / "t.kiln",
        target="vta-sim",
        quantize="int8",
        calibration=tmp / "c.npz",
        tuning_db=str(db),
    )
    v = r.report["vta"]
    assert [lay["layer"] for lay in v["layers"]] == ["conv1", "conv2"]
    best = {w: min(r["cycles"] for r in rs) for w, rs in by_wl.items()}
    for lay in v["layers"]:
        assert lay["tuned"] and lay["cycles"] < lay["default_cycles"]
    assert sorted(lay["cycles"] for lay in v["layers"]) == sorted(best.values())
    assert v["sim_cycles_total"] < v["sim_cycles_default_schedules"]
    m = kiln.load(tmp / "t.kiln")
    np.testing.assert_array_equal(
        m.run({"input": x})["output"], kiln.load(tmp / "t.kiln", accelerator="reference").run({"input": x})["output"]
    )
    # another board's configuration has no records in this database
    with pytest.raises(kiln.KilnError, match="no accelerator tuning records"):
        kiln.compile(
            tmp / "m.onnx",
            tmp / "u.kiln",
            target="vta-sim -board=ultra96",
            quantize="int8",
            calibration=tmp / "c.npz",
            tuning_db=str(db),
        )
    assert main(_cmd(tmp, db, "--trials", "1", "--compact")) == 0
    assert len(vta_tune.load_records(db / key)) == 2  # the best of each workload


def test_database_resumes_after_a_kill(two_layers, tmp_path):
    tmp, _ = two_layers
    db = tmp_path / "db"
    code = "import sys; from kiln.cli import main; sys.exit(main(sys.argv[1:]))"
    p = subprocess.Popen([sys.executable, "-c", code, *_cmd(tmp, db, "--trials", "100000")], stdout=subprocess.PIPE)
    f = db / vta_tune.db_key(VTAConfig.parse()) / vta_tune.FILE
    deadline = time.time() + 120
    while time.time() < deadline and (not f.exists() or len(f.read_text().splitlines()) < 10):
        time.sleep(0.05)
    p.kill()
    p.wait()
    n = len(f.read_text().splitlines())
    assert n >= 10
    with f.open("a") as fh:
        fh.write('{"workload": "torn')  # a write the kill cut short
    with pytest.warns(UserWarning, match="corrupt"):
        kept = vta_tune.load_records(f.parent)
    assert len(kept) >= n - 1
    seen = {(r["workload"], json.dumps(r["schedule"], sort_keys=True)) for r in kept}
    assert main(_cmd(tmp, db, "--trials", "5")) == 0
    after = vta_tune.load_records(f.parent)
    assert len(after) == len(kept) + 5  # the defaults are not measured again, and 5 new candidates are
    assert not seen & {(r["workload"], json.dumps(r["schedule"], sort_keys=True)) for r in after[len(kept) :]}
