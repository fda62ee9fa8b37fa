"""ONNX RoiAlign channels-last (legalize_roi_align) against onnxruntime: both coordinate modes at FPN-like
spatial scales (half_pixel shifted the RoI before scaling in TVM's converter: off wherever the scale is
not 1), RoIs partly outside the map, and a run-time RoI count (a score filter, as in FasterRCNN's box
head), so that the run-time-sized kernel rule schedules it."""

from __future__ import annotations

import numpy as np
from helpers import compile_and_run, make_model, ort_run
from onnx import helper

import kiln


def test_roi_align_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32, 20, 24)).astype(np.float32)
    n = 60
    xy = rng.uniform(-8, 40, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(2, 30, (n, 2))], 1).astype(np.float32)
    feeds = {
        "x": x,
        "boxes": boxes,
        "scores": rng.uniform(0, 1, n).astype(np.float32),
        "batch": rng.integers(0, 2, n).astype(np.int64),
    }
    keep = [
        helper.make_node("Greater", ["scores", "half"], ["hit"]),
        helper.make_node("NonZero", ["hit"], ["nz"]),
        helper.make_node("Squeeze", ["nz", "ax0"], ["idx"]),
        helper.make_node("Gather", ["boxes", "idx"], ["rois"]),
        helper.make_node("Gather", ["batch", "idx"], ["bi"]),
    ]
    align = [
        helper.make_node("RoiAlign", ["x", "rois", "bi"], ["out_half"], output_height=7, output_width=5,
                         sampling_ratio=2, spatial_scale=0.5),  # opset 16: half_pixel
        helper.make_node("RoiAlign", ["x", "rois", "bi"], ["out_output"], output_height=7, output_width=7,
                         sampling_ratio=2, spatial_scale=0.25, coordinate_transformation_mode="output_half_pixel"),
    ]  # fmt: skip
    inits = {"half": np.float32(0.5), "ax0": np.array([0], np.int64)}
    model = make_model(keep + align, feeds, ["out_half", "out_output"], inits, opset=16)
    got = compile_and_run(model, feeds, tmp_path)
    for name, ref in zip(("out_half", "out_output"), ort_run(model, feeds)):
        assert 10 < ref.shape[0] < n  # the filter kept some RoIs: their count is known at run time only
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=name)
    kernels = kiln.load(tmp_path / "m.kiln").manifest["buckets"][0]["kernel_info"]
    assert sum(k.startswith("roi_align_channels_last") for k in kernels) == 2, sorted(kernels)
    assert sum(k.startswith("roi_align_taps") for k in kernels) == 2, sorted(kernels)  # the tabulated taps


def test_roi_align_taps_at_and_past_the_edges(tmp_path):
    """Boxes reaching past every edge of the map, a box entirely outside it and one under a pixel: the
    tabulated taps (clamped indices, zero weights outside) give onnxruntime's result, in both coordinate
    modes, with a fixed RoI count."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 16, 9, 11)).astype(np.float32)
    boxes = np.array(
        [[-20, -20, 60, 60], [30, 20, 90, 80], [-50, -50, -30, -30], [10, 10, 10.5, 10.2], [0, 0, 43.9, 35.9]],
        np.float32,
    )
    feeds = {"x": x, "boxes": boxes, "bi": np.zeros(len(boxes), np.int64)}
    nodes = [
        helper.make_node("RoiAlign", ["x", "boxes", "bi"], ["a"], output_height=3, output_width=4,
                         sampling_ratio=3, spatial_scale=0.25),
        helper.make_node("RoiAlign", ["x", "boxes", "bi"], ["b"], output_height=2, output_width=2,
                         sampling_ratio=1, spatial_scale=0.25, coordinate_transformation_mode="output_half_pixel"),
    ]  # fmt: skip
    model = make_model(nodes, feeds, ["a", "b"], {}, opset=16)
    got = compile_and_run(model, feeds, tmp_path)
    for name, ref in zip(("a", "b"), ort_run(model, feeds)):
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=name)
