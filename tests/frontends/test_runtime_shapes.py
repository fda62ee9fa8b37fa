"""Data-dependent shapes whose rank is static (issue 51): Reduce* with run-time axes over a pinned rank,
Reshape and Expand with run-time target shapes compile with symbolic output dims (no --freeze-input) and
match onnxruntime for every value fed; a value the input cannot take is a run-time InputError."""

import numpy as np
import pytest
from helpers import make_model, ort_run
from onnx import helper

import kiln

X = np.abs(np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)) + 0.1
REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2"]
REDUCE_OPS += ["ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _run_all(m, name, feeds_list, tmp_path, rtol=1e-5, atol=1e-6):
    kiln.compile(m, tmp_path / "m.kiln")
    art = kiln.load(tmp_path / "m.kiln")
    shapes = []
    for feeds in feeds_list:
        ours, ref = art.run(feeds)[name], ort_run(m, feeds)[0]
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, (feeds, ours.shape, ref.shape)
        np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol)
        shapes.append(ref.shape)
    return art, shapes


@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_with_run_time_axes(tmp_path, op, keepdims):
    m = make_model(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)],
        {"x": X, "axes": np.array([0, 2], np.int64)},
        ["y"],
        opset=18,
    )
    feeds = [{"x": X, "axes": np.array(a, np.int64)} for a in ([0, 2], [-1, 1], [1, 0], [2, 0])]
    _, shapes = _run_all(m, "y", feeds, tmp_path)
    assert len(set(shapes)) == 3  # the axes decided the output's shape, per run


def test_reduce_sum_opset13_single_axis_and_bad_axes(tmp_path):
    m = make_model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0), helper.make_node("Relu", ["s"], ["y"])],
        {"x": X, "axes": np.array([1], np.int64)},
        ["y"],
        opset=13,
    )
    art, shapes = _run_all(m, "y", [{"x": X, "axes": np.array([a], np.int64)} for a in (0, 1, 2, -3)], tmp_path)
    assert shapes == [(3, 4), (2, 4), (2, 3), (3, 4)]
    with pytest.raises(kiln.InputError, match="axes fed at run time repeat or are out of range"):
        art.run({"x": X, "axes": np.array([3], np.int64)})


def test_reshape_and_expand_with_run_time_shapes(tmp_path):
    m = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
        {"x": X, "s": np.array([4, 0, -1], np.int64)},
        ["y"],
    )
    feeds = [{"x": X, "s": np.array(s, np.int64)} for s in ([4, 0, -1], [0, 0, 0], [-1, 2, 2], [24, 1, 1])]
    art, shapes = _run_all(m, "y", feeds, tmp_path, rtol=0, atol=0)
    assert shapes == [(4, 3, 2), (2, 3, 4), (6, 2, 2), (24, 1, 1)]
    with pytest.raises(kiln.InputError, match="Reshape .* does not hold the input's elements"):
        art.run({"x": X, "s": np.array([5, 5, 1], np.int64)})
    col = X[0, :, :1]  # (3, 1)
    m = make_model(
        [helper.make_node("Expand", ["x", "s"], ["y"])], {"x": col, "s": np.array([2, 1, 6], np.int64)}, ["y"]
    )
    feeds = [{"x": col, "s": np.array(s, np.int64)} for s in ([2, 1, 6], [1, 3, 1], [1, 3, 4], [5, 1, 1])]
    art, shapes = _run_all(m, "y", feeds, tmp_path, rtol=0, atol=0)
    assert shapes == [(2, 3, 6), (1, 3, 1), (1, 3, 4), (5, 3, 1)]
    with pytest.raises(kiln.InputError, match="Expand .* does not broadcast"):
        art.run({"x": col, "s": np.array([1, 2, 4], np.int64)})


def test_split_with_run_time_sizes(tmp_path):
    x = np.random.default_rng(1).standard_normal((2, 6, 3)).astype(np.float32)
    node = helper.make_node("Split", ["x", "s"], ["a", "b", "c"], axis=1)
    m = make_model([node], {"x": x, "s": np.array([1, 2, 3], np.int64)}, ["a", "b", "c"], opset=13)
    kiln.compile(m, tmp_path / "m.kiln")
    art = kiln.load(tmp_path / "m.kiln")
    for sizes in ([1, 2, 3], [0, 6, 0], [3, 3, 0]):
        feeds = {"x": x, "s": np.array(sizes, np.int64)}
        ours, refs = art.run(feeds), ort_run(m, feeds)
        for name, ref in zip("abc", refs):
            assert ours[name].shape == ref.shape
            np.testing.assert_array_equal(ours[name], ref)
    with pytest.raises(kiln.InputError, match="Split .* do not add up"):
        art.run({"x": x, "s": np.array([1, 1, 1], np.int64)})


def test_split_constant_sizes_with_a_zero(tmp_path):
    """TVM's split takes increasing indices only (LegalizeOps: "split_indices must be increasing")."""
    x = np.random.default_rng(2).standard_normal((2, 6, 3)).astype(np.float32)
    node = helper.make_node("Split", ["x", "s"], ["a", "b", "c"], axis=1)
    m = make_model([node], {"x": x}, ["a", "b", "c"], {"s": np.array([0, 4, 2], np.int64)}, opset=13)
    kiln.compile(m, tmp_path / "m.kiln")
    ours = kiln.load(tmp_path / "m.kiln").run({"x": x})
    for name, ref in zip("abc", ort_run(m, {"x": x})):
        assert ours[name].shape == ref.shape
        np.testing.assert_array_equal(ours[name], ref)


@pytest.mark.parametrize(
    "attrs",
    [
        {"mode": "nearest"},  # half_pixel, round_prefer_floor: 2 -> 7 puts coordinates on ties
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "round_prefer_ceil"},
        {"mode": "nearest", "coordinate_transformation_mode": "align_corners", "nearest_mode": "floor"},
        {"mode": "linear"},
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    ],
)
def test_resize_to_run_time_sizes(tmp_path, attrs):
    x = np.random.default_rng(3).standard_normal((1, 2, 3, 4)).astype(np.float32)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)
    m = make_model([node], {"x": x, "sizes": np.array([1, 2, 7, 8], np.int64)}, ["y"], opset=18)
    feeds = [{"x": x, "sizes": np.array([1, 2, h, w], np.int64)} for h, w in ((7, 8), (2, 3), (6, 9), (1, 1))]
    _, shapes = _run_all(m, "y", feeds, tmp_path, rtol=1e-5, atol=1e-5)
    assert shapes == [(1, 2, 7, 8), (1, 2, 2, 3), (1, 2, 6, 9), (1, 2, 1, 1)]


def test_cumprod_axis_fed_at_run_time(tmp_path):
    """The axis decides no shape: the product along each axis, picked per run (decompose/standard_math.py)."""
    x = np.random.default_rng(4).uniform(0.5, 1.5, (3, 4)).astype(np.float32)
    m = make_model(
        [helper.make_node("CumProd", ["x", "axis"], ["y"], reverse=1)],
        {"x": x, "axis": np.array(0, np.int64)},
        ["y"],
        opset=26,
    )
    feeds = [{"x": x, "axis": np.array(a, np.int64)} for a in (0, 1, -1, -2)]
    _run_all(m, "y", feeds, tmp_path, rtol=1e-6, atol=1e-6)


def test_constant_of_shape_squeeze_and_tile_with_run_time_values(tmp_path):
    filled = helper.make_node("ConstantOfShape", ["s"], ["y"], value=helper.make_tensor("v", 7, [1], [3]))
    m = make_model([filled], {"s": np.array([2, 3], np.int64)}, ["y"])
    _, shapes = _run_all(m, "y", [{"s": np.array(s, np.int64)} for s in ([2, 3], [0, 4], [5, 1])], tmp_path)
    assert shapes == [(2, 3), (0, 4), (5, 1)]
    x = np.random.default_rng(5).standard_normal((1, 3, 1, 2)).astype(np.float32)
    m = make_model([helper.make_node("Squeeze", ["x", "a"], ["y"])], {"x": x, "a": np.array([0, 2], np.int64)}, ["y"])
    feeds = [{"x": x, "a": np.array(a, np.int64)} for a in ([0, 2], [-2, 0], [2, 0])]
    art, shapes = _run_all(m, "y", feeds, tmp_path, rtol=0, atol=0)
    assert shapes == [(3, 2)] * 3
    with pytest.raises(kiln.InputError, match="Squeeze .* name a dim not 1"):
        art.run({"x": x, "a": np.array([0, 1], np.int64)})
    x = x[0, :, 0]  # (3, 2)
    m = make_model([helper.make_node("Tile", ["x", "r"], ["y"])], {"x": x, "r": np.array([2, 3], np.int64)}, ["y"])
    art, shapes = _run_all(m, "y", [{"x": x, "r": np.array(r, np.int64)} for r in ([2, 3], [1, 1], [0, 2])], tmp_path)
    assert shapes == [(6, 6), (3, 2), (0, 4)]
    with pytest.raises(kiln.InputError, match="a repeat is negative"):  # was std::bad_alloc, blamed on Kiln
        art.run({"x": x, "r": np.array([2, -5], np.int64)})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceProd", "ReduceLogSumExp"])
def test_reduce_with_run_time_axes_over_an_empty_axis(tmp_path, op):
    """An input with a zero-size dim: the reduced result is the op's value over no elements (0, -inf, 1, ...)."""
    x = np.zeros((2, 0, 4), np.float32)
    m = make_model(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)],
        {"x": x, "axes": np.array([1], np.int64)},
        ["y"],
        opset=18,
    )
    _, shapes = _run_all(m, "y", [{"x": x, "axes": np.array(a, np.int64)} for a in ([1], [-2], [0])], tmp_path)
    assert shapes == [(2, 1, 4), (2, 1, 4), (1, 0, 4)]
