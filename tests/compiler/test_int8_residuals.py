"""Int8Residuals: in a --quantize int8 build, a residual add whose operand is also quantized for an int8 conv
reads the uint8 codes (dequantized) instead of float32; other adds are left alone. Numerics against onnxruntime
within int8 tolerances, with and without the pass."""

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln


def _block():
    """c0 -> ReLU = r0 (read by c1 and by the residual add); c1 3x3 -> ReLU -> c2 1x1; c2 + r0 -> ReLU."""
    conv = lambda i, o, w, k: helper.make_node("Conv", [i, w, w + "_b"], [o], kernel_shape=[k, k], pads=[k // 2] * 4)
    nodes = [
        conv("x", "c0", "w0", 3),
        helper.make_node("Relu", ["c0"], ["r0"]),
        conv("r0", "c1", "w1", 3),
        helper.make_node("Relu", ["c1"], ["r1"]),
        conv("r1", "c2", "w2", 1),
        helper.make_node("Add", ["c2", "r0"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    inits = {f"w{i}": rand(32, 32 if i else 16, k, k, seed=i + 1) * 0.15 for i, k in enumerate((3, 3, 1))}
    inits.update({f"w{i}_b": rand(32, seed=10 + i) * 0.1 for i in range(3)})
    return make_model(nodes, {"x": rand(1, 16, 14, 14)}, ["y"], inits)


def _cosine(a, b):
    return float(a.ravel() @ b.ravel() / np.linalg.norm(a) / np.linalg.norm(b))


def test_residual_reads_the_codes(tmp_path):
    m = _block()
    np.savez(tmp_path / "calib.npz", x=np.abs(rand(16, 16, 14, 14, seed=3)))
    opts = dict(quantize="int8", calibration=tmp_path / "calib.npz", calib_samples=16)
    on = kiln.compile(m, tmp_path / "on.kiln", **opts)
    if len(on.report["quantization"]["int8_layers"]) != 3:
        pytest.skip("no int8 kernel for this host's CPU: the layers stay float, no residual is quantized")
    off = kiln.compile(m, tmp_path / "off.kiln", disabled_passes=("Int8Residuals",), **opts)
    assert on.report["int8_residuals"] == 1 and "int8_residuals" not in off.report
    x = np.abs(rand(1, 16, 14, 14, seed=8))
    ref = ort_run(m, {"x": x})[0]
    got_on, got_off = (kiln.load(tmp_path / f"{n}.kiln").run({"x": x})["y"] for n in ("on", "off"))
    assert _cosine(got_on, ref) > 0.999 and _cosine(got_off, ref) > 0.999
    assert not np.array_equal(got_on, got_off)  # the residual really is the quantized one
    # the residual's rounding: about half a step of r0's 255 (its calibrated range), well under the output's range
    assert np.abs(got_on - got_off).max() < 0.02 * np.abs(ref).max()


def test_float_build_untouched(tmp_path):
    """The float32 build has no quantized residuals."""
    r = kiln.compile(_block(), tmp_path / "f.kiln")
    assert r.report.get("int8_residuals", 0) == 0
