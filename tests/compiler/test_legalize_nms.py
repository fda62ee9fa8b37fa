"""ONNX NonMaxSuppression on Kiln's kernel (legalize_nms): the ONNX backend node tests' cases give the
expected selections, onnxruntime those of detector-sized inputs (torchvision's one-class NMS over boxes
shifted apart per class, and a many-class one), the AVX2 build's 8-lane path runs on any x86-64 host."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import ort_run
from onnx import helper
from onnx.backend.test.case.node import collect_testcases

import kiln
from kiln.runtime.hostinfo import host_arch


def _nms_testcases():
    """onnx's NonMaxSuppression node tests: importing their module alone makes them (collect_testcases
    imports every op's module first, 8 s); where it is imported already, collect_testcases."""
    import importlib
    import sys

    import onnx.backend.test.case.node as cases

    module = "onnx.backend.test.case.node.nonmaxsuppression"
    if module in sys.modules:
        found = collect_testcases("NonMaxSuppression")
    else:
        cases._TargetOpType = "NonMaxSuppression"
        importlib.import_module(module)
        found = cases._NodeTestCases
    return [c for c in found if c.name.startswith("test_nonmaxsuppression_")]


def _backend_cases():
    """(name, model, inputs, expected) of onnx's own NonMaxSuppression cases."""
    out = []
    for case in _nms_testcases():
        for inputs, outputs in case.data_sets:
            out.append((case.name.removeprefix("test_nonmaxsuppression_"), case.model, inputs, outputs[0]))
    return out


def _all_in_one():
    """Every backend case as one node of one model: its boxes and scores are inputs, its limit and
    thresholds initializers (Kiln needs them constant); one compile for all ten."""
    nodes, inputs, inits, outputs, feeds, expected = [], [], [], [], {}, {}
    for name, model, arrays, want in _backend_cases():
        src = model.graph.node[0]
        names = []
        for vi, a in zip(model.graph.input, arrays):
            n = f"{name}_{vi.name}"
            names.append(n)
            if vi.name in ("boxes", "scores"):
                inputs.append(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(a.shape)))
                feeds[n] = a
            else:
                inits.append(onnx.numpy_helper.from_array(a, n))
        attrs = {a.name: helper.get_attribute_value(a) for a in src.attribute}
        nodes.append(helper.make_node("NonMaxSuppression", names, [f"{name}_sel"], **attrs))
        outputs.append(helper.make_tensor_value_info(f"{name}_sel", onnx.TensorProto.INT64, None))
        expected[f"{name}_sel"] = want
    g = helper.make_graph(nodes, "nms_cases", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)]), feeds, expected


def _kernels(path) -> list[str]:
    return list(kiln.load(path).manifest["buckets"][0]["kernel_info"])


def test_onnx_backend_cases(tmp_path):
    model, feeds, expected = _all_in_one()
    assert len(expected) == 10, sorted(expected)  # suppress by IoU (and scores), flipped corners, limit, ...
    kiln.compile(model, tmp_path / "m.kiln")
    assert sum(k.startswith("kiln_nms") for k in _kernels(tmp_path / "m.kiln")) == len(expected)
    got = kiln.load(tmp_path / "m.kiln").run(feeds)
    for name, want in expected.items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def _detector_boxes(rng, n, classes_apart: int):
    """n boxes on a 320x320 image, clustered so that NMS suppresses many; with classes_apart > 1 shifted
    by class * 1000 (torchvision's batched_nms coordinate trick: classes never overlap)."""
    centers = rng.uniform(0, 300, (n // 20 + 1, 2))
    xy = centers[rng.integers(0, len(centers), n)] + rng.normal(0, 3, (n, 2))
    wh = rng.uniform(20, 30, (n, 2))
    shift = (rng.integers(0, classes_apart, n) * 1000.0)[:, None]
    return np.concatenate([xy + shift, xy + wh + shift], 1)[None].astype(np.float32)


@pytest.mark.skipif(host_arch() != "x86_64", reason="the AVX2 build runs on x86-64 hosts")
def test_detector_sized_inputs_match_onnxruntime_avx2(tmp_path):
    """3000 boxes in one class (with a score threshold and no limit) and 40 classes x 500 boxes (a limit of
    20 per class), built for haswell (8 lanes: two vectors of kept boxes per step): onnxruntime's
    selections, row for row."""
    rng = np.random.default_rng(0)
    feeds = {
        "b1": _detector_boxes(rng, 3000, 10),
        "s1": rng.uniform(0, 1, (1, 1, 3000)).astype(np.float32),
        "b2": _detector_boxes(rng, 500, 1),
        "s2": rng.uniform(0, 1, (1, 40, 500)).astype(np.float32),
    }
    inits = {
        "none": np.array([2**62], np.int64),
        "twenty": np.array([20], np.int64),
        "iou": np.array([0.55], np.float32),
        "thr": np.array([0.05], np.float32),
    }
    nodes = [
        helper.make_node("NonMaxSuppression", ["b1", "s1", "none", "iou", "thr"], ["one_class"]),
        helper.make_node("NonMaxSuppression", ["b2", "s2", "twenty", "iou"], ["many_classes"]),
    ]
    g = helper.make_graph(
        nodes,
        "nms",
        [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, onnx.TensorProto.INT64, None) for o in ("one_class", "many_classes")],
        [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    kiln.compile(model, tmp_path / "m.kiln", target="llvm -mcpu=haswell")
    assert sum(k.startswith("kiln_nms") for k in _kernels(tmp_path / "m.kiln")) == 2
    got = kiln.load(tmp_path / "m.kiln").run(feeds)
    one, many = ort_run(model, feeds)
    candidates = int((feeds["s1"] > 0.05).sum())
    assert 100 < len(one) < 0.8 * candidates and len(many) == 40 * 20  # NMS dropped some, kept some
    np.testing.assert_array_equal(got["one_class"], one)
    np.testing.assert_array_equal(got["many_classes"], many)
