"""Artifacts whose ops need VM builtins TVM implements in its compiler package (NonZero, Unique) or
in libtvm_runtime_extra (TopK's sort kernels) load and run in a fresh process, where Kiln's runtime
has loaded TVM's runtime library alone. In the compiling process they always worked, which hid it:
the corpus' FasterRCNN artifact failed to load with "Cannot find ffi::Function relax.run.nonzero"."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from helpers import make_model, ort_run
from onnx import helper

import kiln

PROBE = """
import json, sys
import numpy as np
import kiln
m = kiln.load(sys.argv[1])
out = m.run({"x": np.load(sys.argv[2])})
print(json.dumps({"runtime_only": "tvm.relax" not in sys.modules,
                  "out": {k: np.asarray(v).tolist() for k, v in out.items()}}))
"""


def test_nonzero_unique_topk_run_on_the_runtime_alone(tmp_path):
    x = np.array([[3.0, 0.0, 1.0, 3.0], [0.0, 2.0, 1.0, 5.0]], np.float32)
    k = np.array([3], np.int64)
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("TopK", ["x", "k"], ["vals", "idx"], axis=1),
        helper.make_node("Unique", ["x"], ["u", "ui", "uinv", "uc"], sorted=0),
    ]
    model = make_model(nodes, {"x": x}, ["nz", "vals", "idx", "u", "ui", "uinv", "uc"], inits={"k": k})
    path = tmp_path / "m.kiln"
    kiln.compile(model, path)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["runtime_only"], "the probe should have loaded TVM's runtime only"
    names = [o.name for o in model.graph.output]
    for name, ref in zip(names, ort_run(model, {"x": x})):
        np.testing.assert_array_equal(np.asarray(info["out"][name], ref.dtype).reshape(ref.shape), ref, err_msg=name)


CHECK_PROBE = """
import json, sys
import numpy as np
import kiln
m = kiln.load(sys.argv[1], warmup=True)  # zeros: sr = 0 fails the check, which ends the warm-up, not the load
x = np.load(sys.argv[2])
out = m.run({"x": x, "sr": np.array(16000, np.int64)})["y"]
try:
    m.run({"x": x, "sr": np.array(8000, np.int64)})
    error = None
except kiln.InputError as e:
    error = str(e)
print(json.dumps({"runtime_only": "tvm.relax" not in sys.modules, "out": out.tolist(), "error": error}))
"""


def test_run_time_checks_run_on_the_runtime_alone(tmp_path):
    """The checks the frontends compile in (relax.run.assert_op: here an If branch dropped for the pinned shapes)
    pass and fail in a process without the compiler: the corpus' silero_vad artifact failed `kiln bench` with
    "Cannot find ffi::Function relax.run.assert_op" while it matched onnxruntime in the compiling process, then
    in the load's warm-up on zeros (a sample rate of 0)."""
    import warnings

    from frontends.test_impossible_branches import _vad

    model = _vad()
    path = tmp_path / "m.kiln"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dropped branch's KilnWarning: tests/frontends/test_impossible_branches.py
        kiln.compile(model, path, input_shapes=["x:1x512"])
    x = np.random.default_rng(3).standard_normal((1, 512)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run(
        [sys.executable, "-c", CHECK_PROBE, str(path), str(tmp_path / "x.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["runtime_only"], "the probe should have loaded TVM's runtime only"
    ref = ort_run(model, {"x": x, "sr": np.array(16000, np.int64)})[0]
    np.testing.assert_allclose(np.asarray(info["out"], np.float32), ref, atol=1e-5)
    assert info["error"] and "`sr` selects the then branch of If node 'sr_if'" in info["error"]


def test_measuring_commands_take_inputs_a_run_time_check_accepts(tmp_path, capsys):
    """`kiln profile` timed the VM's entry on random inputs, so a compiled check that rejected them (silero VAD's
    sample rate: random ints are 0 or 1) surfaced as "internal error ... report it". Now random inputs the model
    rejects are an input error whose fix is --inputs, in bench and profile, and --inputs profiles the model."""
    import warnings

    from frontends.test_impossible_branches import _vad

    from kiln.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.compile(_vad(), tmp_path / "m.kiln", input_shapes=["x:1x512"])
    x = np.random.default_rng(3).standard_normal((1, 512)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x, sr=np.array(16000, np.int64))
    art = str(tmp_path / "m.kiln")
    for cmd in (["profile", art, "--repeat", "2"], ["bench", art, "--repeat", "2"]):
        assert main(cmd) != 0
        err = capsys.readouterr().err
        assert "internal error" not in err and "the random inputs were rejected" in err and "--inputs IN.npz" in err
    out = tmp_path / "p.json"
    assert main(["profile", art, "--repeat", "2", "--inputs", str(tmp_path / "in.npz"), "--json", str(out)]) == 0
    p = json.loads(out.read_text())
    assert p["kernels"] and any(k["kernel"] == "relax.run.assert_op" for k in p["kernels"])


def test_assert_op_reads_its_condition_without_a_copy():
    """relax.run.assert_op runs in Python on every run of a model with a run-time check: its condition is read over
    DLPack (Tensor.numpy() cost 7 us of silero VAD's 58); a false one raises the message, a non-scalar is refused."""
    import pytest

    from kiln.runtime import builtins
    from kiln.runtime.model import _import_tvm_runtime

    tvm, _ = _import_tvm_runtime()
    builtins._assert_op(tvm, tvm.runtime.tensor(np.array(True)), "never")
    with pytest.raises(AssertionError, match="sr was 3"):
        builtins._assert_op(tvm, tvm.runtime.tensor(np.array(False)), "sr was {}", 3)
    for bad in (np.array([True]), np.array(1, np.int32)):
        with pytest.raises(ValueError, match="bool scalar"):
            builtins._assert_op(tvm, tvm.runtime.tensor(bad), "x")
    assert builtins._numpy(tvm.runtime.tensor(np.array(True))).dtype == np.bool_
