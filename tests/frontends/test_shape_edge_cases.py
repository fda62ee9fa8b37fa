"""Shapes at the edges of what TVM 0.27 follows, each against onnxruntime: Unsqueeze with rank-0 constant axes
(decompose/scalar_axes.py), a Concat with an empty padding (simplify.py), and a chain of run-time shapes TVM
cannot follow, refused naming the input to freeze (compiler/fallback.py), then compiled frozen."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, ort_run
from onnx import helper

import kiln


def test_unsqueeze_scalar_axes(tmp_path):
    """onnx's own function bodies (the expanded AffineGrid) write Unsqueeze(x, -1) with a rank-0 axes constant."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["u"]), helper.make_node("Unsqueeze", ["u", "ax"], ["y"])]
    check_against_ort(make_model(nodes, {"x": x}, ["y"], {"ax": np.array(-1, np.int64)}, opset=18), {"x": x}, tmp_path)


def test_concat_with_empty_padding(tmp_path):
    """CausalConvWithState's body for kernel size 1: a zero-length padding (CastLike of an empty constant)
    concatenated before the input, and the state an empty slice of the result."""
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    nodes = [
        helper.make_node("CastLike", ["pad", "x"], ["padc"]),
        helper.make_node("Concat", ["padc", "x"], ["padded"], axis=2),
        helper.make_node("Relu", ["padded"], ["y"]),
        helper.make_node("Slice", ["padded", "start", "end", "axes"], ["state"]),
    ]
    inits = {
        "pad": np.zeros((2, 4, 0), np.float32),
        "start": np.array([8]),
        "end": np.array([8]),
        "axes": np.array([2]),
    }
    ours = check_against_ort(make_model(nodes, {"x": x}, ["y", "state"], inits, opset=18), {"x": x}, tmp_path)
    assert ours["state"].shape == (2, 4, 0)


def test_runtime_shape_chain_refused_then_frozen(tmp_path):
    """Range over a run-time size, then a Squeeze without axes: TVM loses the rank. The error names the input
    (so --freeze-input can be given); frozen, every shape is static and the model matches onnxruntime."""
    size = np.array([3, 5], np.int64)
    nodes = [
        helper.make_node("Split", ["size"], ["h", "w"], num_outputs=2, axis=0),
        *[helper.make_node("Squeeze", [d], [d + "s"]) for d in ("h", "w")],
        *[helper.make_node("Range", ["zero", d + "s", "one"], ["r" + d]) for d in ("h", "w")],
        helper.make_node("Unsqueeze", ["rh", "ax1"], ["rh2"]),
        helper.make_node("Unsqueeze", ["rw", "ax0"], ["rw2"]),
        helper.make_node("Add", ["rh2", "rw2"], ["grid"]),
        helper.make_node("Squeeze", ["grid"], ["g2"]),
        helper.make_node("Transpose", ["g2"], ["y"], perm=[1, 0]),
    ]
    inits = {"zero": np.array(0), "one": np.array(1), "ax1": np.array([1]), "ax0": np.array([0])}
    m = make_model(nodes, {"size": size}, ["y"], inits, opset=18)
    with pytest.raises(kiln.UnsupportedModelError, match="'size'") as e:
        kiln.compile(m, tmp_path / "m.kiln")
    assert [op["sources"] for op in e.value.ops] == [["size"]] and "--freeze-input size=" in str(e.value)
    kiln.compile(m, tmp_path / "f.kiln", freeze_inputs={"size": size})
    np.testing.assert_array_equal(kiln.load(tmp_path / "f.kiln").run({})["y"], ort_run(m, {"size": size})[0])
