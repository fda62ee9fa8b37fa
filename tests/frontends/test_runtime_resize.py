"""Resize and Upsample with roi, scales or sizes fed at run time (issue 51): compiled without --freeze-input,
the resized dims symbolic, each run matching onnxruntime (float64 coordinates as onnx's reference; weights
applied in float32: rtol 1e-4, atol 1e-5) for several values fed to the same compiled model."""

import numpy as np
import pytest
from helpers import check_runs_against_ort, make_model
from onnx import helper

X = np.random.default_rng(7).standard_normal((1, 2, 5, 6)).astype(np.float32)


def _check(m, feeds_list, tmp_path):
    return check_runs_against_ort(m, feeds_list, tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "attrs",
    [
        {"mode": "nearest", "nearest_mode": "round_prefer_ceil"},
        {"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
        {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5},
        {"mode": "linear", "antialias": 1},
        {"mode": "cubic", "antialias": 1, "coordinate_transformation_mode": "half_pixel_symmetric"},
    ],
)
def test_resize_with_run_time_scales(tmp_path, attrs):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    scales = np.array([1, 1, 0.6, 1.6], np.float32)
    m = make_model([node], {"x": X, "scales": scales}, ["y"], opset=19)
    feeds = [{"x": X, "scales": np.array(s, np.float32)} for s in ([1, 1, 0.6, 1.6], [1, 1, 2, 0.5], [1, 1, 1, 1])]
    assert _check(m, feeds, tmp_path) == [(1, 2, 3, 9), (1, 2, 10, 3), (1, 2, 5, 6)]


def test_resize_sizes_with_axes_and_aspect_ratio(tmp_path):
    node = helper.make_node(
        "Resize", ["x", "", "", "sizes"], ["y"], mode="linear", axes=[3, 2], keep_aspect_ratio_policy="not_larger"
    )
    m = make_model([node], {"x": X, "sizes": np.array([9, 4], np.int64)}, ["y"], opset=19)
    feeds = [{"x": X, "sizes": np.array(s, np.int64)} for s in ([9, 4], [12, 20], [3, 3])]
    assert _check(m, feeds, tmp_path) == [(1, 2, 4, 5), (1, 2, 10, 12), (1, 2, 3, 3)]


def test_tf_crop_and_resize_with_run_time_roi(tmp_path):
    node = helper.make_node(
        "Resize",
        ["x", "roi", "", "sizes"],
        ["y"],
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=7.0,
        axes=[2, 3],
    )
    roi, sizes = np.array([0.2, -0.3, 0.9, 1.2], np.float32), np.array([4, 5], np.int64)
    m = make_model([node], {"x": X, "roi": roi, "sizes": sizes}, ["y"], opset=19)
    rois = ([0.2, -0.3, 0.9, 1.2], [0, 0, 1, 1], [0.5, 0.1, 0.5, 0.6])
    feeds = [{"x": X, "roi": np.array(r, np.float32), "sizes": sizes} for r in rois]
    assert _check(m, feeds, tmp_path) == [(1, 2, 4, 5)] * 3


def test_upsample_with_run_time_scales(tmp_path):
    m = make_model(
        [helper.make_node("Upsample", ["x", "s"], ["y"])],
        {"x": X, "s": np.array([1, 1, 2, 3], np.float32)},
        ["y"],
        opset=9,
    )
    feeds = [{"x": X, "s": np.array(s, np.float32)} for s in ([1, 1, 2, 3], [1, 2, 1, 2])]
    assert _check(m, feeds, tmp_path) == [(1, 2, 10, 18), (1, 4, 5, 12)]
