"""Pad with pads (and fill value) fed at run time, and CenterCropPad with a run-time shape (issue 51): compiled
without --freeze-input, the padded dims symbolic, each run equal to onnxruntime (a gather: exact) for several
values fed to the same compiled model, crops (negative pads) included."""

import numpy as np
import pytest
from helpers import check_runs_against_ort, make_model
from onnx import helper

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def _check(m, feeds_list, tmp_path):
    return check_runs_against_ort(m, feeds_list, tmp_path)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_with_run_time_pads(tmp_path, mode):
    pads = np.array([0, 1, 1, 1, 0, 2], np.int64)
    m = make_model([helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)], {"x": X, "pads": pads}, ["y"], opset=19)
    values = ([0, 1, 1, 1, 0, 2], [0, 0, 0, 0, 0, 0], [1, 1, -1, 0, -1, 2])  # reflect: pads below the axis' length
    feeds = [{"x": X, "pads": np.array(p, np.int64)} for p in values]
    assert _check(m, feeds, tmp_path) == [(3, 4, 7), (2, 3, 4), (3, 3, 5)]


def test_pad_with_run_time_pads_value_and_constant_axes(tmp_path):
    node = helper.make_node("Pad", ["x", "pads", "v", "axes"], ["y"])
    m = make_model(
        [node],
        {"x": X, "pads": np.array([1, 2, 0, 1], np.int64), "v": np.array(-5, np.float32)},
        ["y"],
        {"axes": np.array([-1, 0], np.int64)},
        opset=19,
    )
    feeds = [
        {"x": X, "pads": np.array(p, np.int64), "v": np.array(v, np.float32)}
        for p, v in (([1, 2, 0, 1], -5), ([0, 0, 3, 0], 2.5))
    ]
    assert _check(m, feeds, tmp_path) == [(5, 3, 5), (2, 3, 7)]


def test_center_crop_pad_with_run_time_shape(tmp_path):
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], axes=[1, 2])
    m = make_model([node], {"x": X, "shape": np.array([5, 2], np.int64)}, ["y"], opset=18)
    feeds = [{"x": X, "shape": np.array(s, np.int64)} for s in ([5, 2], [1, 7], [3, 4])]
    assert _check(m, feeds, tmp_path) == [(2, 5, 2), (2, 1, 7), (2, 3, 4)]
