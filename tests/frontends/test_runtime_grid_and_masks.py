"""AffineGrid with a run-time size, Trilu with a run-time k and Range with run-time limits (issue 51): compiled
without --freeze-input, each run matching onnxruntime for several values fed to the same compiled model
(AffineGrid: onnx's reference grid, float32 arithmetic, rtol 1e-5 / atol 1e-6; Trilu and Range: exact)."""

import numpy as np
import pytest
from helpers import check_runs_against_ort, make_model
from onnx import helper


def _check(m, feeds_list, tmp_path, rtol=0.0, atol=0.0):
    return check_runs_against_ort(m, feeds_list, tmp_path, rtol=rtol, atol=atol)


@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid_2d_with_run_time_size(tmp_path, align_corners):
    theta = np.random.default_rng(1).standard_normal((2, 2, 3)).astype(np.float32)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["y"], align_corners=align_corners)
    m = make_model([node], {"theta": theta, "size": np.array([2, 3, 4, 5], np.int64)}, ["y"], opset=20)
    feeds = [{"theta": theta, "size": np.array([2, 3, h, w], np.int64)} for h, w in ((4, 5), (2, 7), (6, 3))]
    shapes = _check(m, feeds, tmp_path, rtol=1e-5, atol=1e-6)
    assert shapes == [(2, 4, 5, 2), (2, 2, 7, 2), (2, 6, 3, 2)]  # a length-1 axis with align_corners: no spec


def test_affine_grid_3d_with_run_time_size(tmp_path):
    theta = np.random.default_rng(2).standard_normal((1, 3, 4)).astype(np.float32)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["y"])
    m = make_model([node], {"theta": theta, "size": np.array([1, 1, 2, 3, 4], np.int64)}, ["y"], opset=20)
    feeds = [{"theta": theta, "size": np.array([1, 1, d, h, w], np.int64)} for d, h, w in ((2, 3, 4), (3, 1, 2))]
    assert _check(m, feeds, tmp_path, rtol=1e-5, atol=1e-6) == [(1, 2, 3, 4, 3), (1, 3, 1, 2, 3)]


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_with_run_time_k(tmp_path, upper):
    x = np.arange(2 * 4 * 5, dtype=np.float32).reshape(2, 4, 5) + 1
    m = make_model(
        [helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)], {"x": x, "k": np.array(0, np.int64)}, ["y"]
    )
    _check(m, [{"x": x, "k": np.array(k, np.int64)} for k in (0, 2, -3, 9, -9)], tmp_path)


def test_range_with_run_time_limits(tmp_path):
    feeds = {"a": np.array(1.5, np.float32), "b": np.array(7, np.float32), "d": np.array(1.25, np.float32)}
    m = make_model([helper.make_node("Range", ["a", "b", "d"], ["y"])], feeds, ["y"])
    values = [(1.5, 7, 1.25), (3, -2, -0.5), (0, 0, 1)]
    runs = [{k: np.array(v, np.float32) for k, v in zip("abd", vs)} for vs in values]
    assert _check(m, runs, tmp_path, rtol=1e-6) == [(5,), (10,), (0,)]
