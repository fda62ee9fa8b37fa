"""Cross-compilation never runs the target's code on the host: for a target whose features this
host lacks (chosen at run time), int8 calibration and the accuracy check run a host build, and
--layout auto and kiln tune are OptionsErrors naming the missing features (never a SIGILL)."""

import shutil

import numpy as np
import pytest
from test_quantize import _calib_cnn

import kiln
from kiln.compiler.hostrun import missing_on_host
from kiln.target import Target

# x86 CPUs from the newest down: the first this host cannot run; else an arm64 board (cross-linked)
CANDIDATES = (
    "llvm -mcpu=graniterapids",
    "llvm -mcpu=sapphirerapids",
    "llvm -mcpu=znver4",
    "llvm -mcpu=skylake-avx512",
    "llvm -mcpu=alderlake",
    "llvm -mcpu=haswell",
)


def _foreign_target() -> str:
    for spec in CANDIDATES:
        if missing_on_host(Target.parse(spec)):
            return spec
    if shutil.which("aarch64-linux-gnu-g++"):
        return "rpi5"
    pytest.skip("this host runs every x86 target in the list and no aarch64 cross linker is installed")


def test_int8_for_a_target_this_host_cannot_run(tmp_path):
    spec = _foreign_target()
    model, calib, data = _calib_cnn(tmp_path)
    r = kiln.compile(model, tmp_path / "q.kiln", target=spec, quantize="int8", calibration=calib, calib_samples=8)
    q = r.report["quantization"]
    assert len(q["int8_layers"]) == 3 and q["accuracy"]["measured_on"].startswith("host build")
    assert r.manifest["target"] == str(Target.parse(spec)) and missing_on_host(Target.parse(spec))
    # the same int8 graph built for the host computes what the host measured: compare with it
    host = kiln.compile(model, tmp_path / "h.kiln", quantize="int8", calibration=calib, calib_samples=8)
    assert host.report["quantization"]["int8_layers"] == q["int8_layers"]
    out = kiln.load(tmp_path / "h.kiln").run({"input": data[:1]})["output"]
    assert np.isfinite(out).all()


def test_layout_auto_and_tune_refuse_a_target_this_host_cannot_run(tmp_path):
    spec = _foreign_target()
    model, _, _ = _calib_cnn(tmp_path)
    with pytest.raises(kiln.OptionsError, match="--layout auto runs the target's code, and this host lacks") as e:
        kiln.compile(model, tmp_path / "a.kiln", target=spec, layout="auto")
    assert e.value.where == "--layout"
    from kiln.compiler import CompileOptions
    from kiln.compiler.tune import tune
    from kiln.schedules.tuning.tuning import TuneOptions

    with pytest.raises(kiln.OptionsError, match="kiln tune runs the target's code.*--rpc-tracker"):
        tune(model, CompileOptions.make(target=spec), TuneOptions(db_root=str(tmp_path / "db"), trials=4))
    assert not (tmp_path / "a.kiln").exists() and not (tmp_path / "db").exists()
