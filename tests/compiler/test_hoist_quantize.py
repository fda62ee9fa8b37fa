"""HoistQuantize: in a --quantize int8 build the quantize after a max pool and after a strided shortcut's slice
moves above it: exact, the same result bit for bit, and close to onnxruntime's float result."""

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln


def _stem_pool_block():
    """conv 3x3 -> ReLU -> max pool = p; p -> conv 1x1 = a (-> ReLU); p -> stride-2 1x1 conv = d; the graph's
    outputs: a's ReLU and d (the shortcut reads p sliced)."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("MaxPool", ["r0"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c1"], ["a"]),
        helper.make_node("Conv", ["a", "w2", "b2"], ["d"], kernel_shape=[1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["a", "w3", "b3"], ["e"], kernel_shape=[1, 1]),
    ]
    inits = {f"w{i}": rand(32, 16 if i == 0 else 32, k, k, seed=i + 1) * 0.2 for i, k in enumerate((3, 1, 1, 1))}
    inits.update({f"b{i}": rand(32, seed=10 + i) * 0.1 for i in range(4)})
    return make_model(nodes, {"x": rand(1, 16, 16, 16)}, ["d", "e"], inits)


def _cosine(a, b):
    return float(a.ravel() @ b.ravel() / np.linalg.norm(a) / np.linalg.norm(b))


def _int8_build(tmp_path):
    """(model, the int8 compile options, its --quantize int8 build as on.kiln); skips where nothing is int8."""
    m = _stem_pool_block()
    np.savez(tmp_path / "calib.npz", x=rand(12, 16, 16, 16, seed=3))
    opts = dict(quantize="int8", calibration=tmp_path / "calib.npz", calib_samples=12)
    on = kiln.compile(m, tmp_path / "on.kiln", **opts)
    if len(on.report["quantization"]["int8_layers"]) < 4:
        pytest.skip("no int8 kernel for this host's CPU: the layers stay float, nothing is quantized")
    return m, opts, on


def test_pool_and_slice_read_codes(tmp_path):
    m, opts, on = _int8_build(tmp_path)
    off = kiln.compile(m, tmp_path / "off.kiln", disabled_passes=("HoistQuantize",), **opts)
    assert on.report["quantizes_hoisted"] == 2 and "quantizes_hoisted" not in off.report  # the pool, the slice
    x = rand(1, 16, 16, 16, seed=8)
    ref = ort_run(m, {"x": x})
    got_on, got_off = (kiln.load(tmp_path / f"{n}.kiln").run({"x": x}) for n in ("on", "off"))
    # quantizing commutes exactly with the pool and the slice
    np.testing.assert_array_equal(got_on["e"], got_off["e"])
    np.testing.assert_array_equal(got_on["d"], got_off["d"])
    assert _cosine(got_on["d"], ref[0]) > 0.999 and _cosine(got_on["e"], ref[1]) > 0.999


def test_one_tensor_is_quantized_once_for_its_layers(tmp_path, monkeypatch):
    """a feeds the 1x1 conv e and the strided shortcut d: calibration gives both one range (shared_ranges), so the
    two quantizes of a are the same ops, and a's conv writes the codes itself for e and for d's slice. With a range
    each, it wrote float32 for two quantize kernels to read (one kernel more)."""
    import kiln.compiler.quantize.flow as flow

    m, opts, on = _int8_build(tmp_path)
    monkeypatch.setattr(flow, "shared_ranges", lambda ranges, shared: ranges)
    off = kiln.compile(m, tmp_path / "off.kiln", **opts)
    kernels = [list(r.manifest["buckets"][0]["kernel_info"]) for r in (on, off)]
    assert len(kernels[0]) == len(kernels[1]) - 1, kernels
    x = rand(1, 16, 16, 16, seed=8)
    ref, got = ort_run(m, {"x": x}), kiln.load(tmp_path / "on.kiln").run({"x": x})
    assert _cosine(got["d"], ref[0]) > 0.999 and _cosine(got["e"], ref[1]) > 0.999


def test_shared_ranges_take_the_widest():
    from kiln.compiler.quantize.rewrite import shared_ranges

    ranges = {"a": (-1.0, 2.0), "b": (0.0, 3.0), "c": (-5.0, 1.0), "d": (0.0, 1.0)}
    got = shared_ranges(ranges, [["a", "b"], ["c", "missing"]])
    assert got["a"] == got["b"] == (-1.0, 3.0)
    assert got["c"] == (-5.0, 1.0) and got["d"] == (0.0, 1.0)  # a group with a layer left float: as calibrated
