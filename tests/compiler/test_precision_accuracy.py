"""--precision bf16 --calibration DATA: the build's accuracy against float32 on the samples, in the report and
printed by kiln compile (as the int8 flow reports its own); without --calibration nothing is measured."""

import subprocess
import sys

import numpy as np
import pytest
from helpers import make_model, rand
from onnx import helper

import kiln
from kiln.errors import OptionsError


def _model():
    nodes = [helper.make_node("MatMul", ["input", "w"], ["mm"]), helper.make_node("Relu", ["mm"], ["output"])]
    return make_model(nodes, {"input": rand(1, 8, 32)}, ["output"], {"w": rand(32, 48, seed=1) * 0.3})


def test_bf16_measured_against_float32(tmp_path):
    np.savez(tmp_path / "calib.npz", input=rand(3, 8, 32, seed=5))
    r = kiln.compile(_model(), tmp_path / "m.kiln", precision="bf16", calibration=str(tmp_path / "calib.npz"))
    acc = r.report["precision_accuracy"]
    assert acc["precision"] == "bf16" and acc["accuracy"]["samples"] == 3
    out = acc["accuracy"]["outputs"]["output"]
    # bf16 operands: errors of a few bf16 ulps of the output's range, never zero, cosine close to 1
    assert 0 < out["max_abs_error"] < 0.05 * out["float_abs_max"] and out["cosine"] > 0.999
    r = kiln.compile(_model(), tmp_path / "n.kiln", precision="bf16")
    assert "precision_accuracy" not in r.report


def test_kiln_compile_prints_it(tmp_path):
    np.savez(tmp_path / "calib.npz", input=rand(2, 8, 32, seed=5))
    import onnx

    onnx.save(_model(), tmp_path / "m.onnx")
    cmd = [sys.executable, "-m", "kiln", "compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.kiln")]
    out = subprocess.run(
        [*cmd, "--precision", "bf16", "--calibration", str(tmp_path / "calib.npz")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "accuracy vs the float32 build on 2 samples" in out.stdout and "cosine" in out.stdout


def test_calibration_without_quantize_or_precision_is_refused(tmp_path):
    np.savez(tmp_path / "calib.npz", input=rand(2, 8, 32, seed=5))
    with pytest.raises(OptionsError, match="--precision bf16"):
        kiln.compile(_model(), tmp_path / "m.kiln", calibration=str(tmp_path / "calib.npz"))
