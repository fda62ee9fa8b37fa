"""Detection post-processing (torchvision SSD/RetinaNet/FasterRCNN heads): outputs whose size depends on
the data. Small graphs built with onnx.helper, each compiled by Kiln and matched against onnxruntime:
score threshold -> NonZero -> TopK with k = min(candidates, limit) -> NMS -> Gather, arithmetic on the
run-time-sized results (an Add of two such tensors failed in tvm.compile), ConstantOfShape of a run-time
shape, an If whose branches have different run-time sizes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

ort = pytest.importorskip("onnxruntime")
import kiln  # noqa: E402

N = 48


def _c(name, a, dtype=None):
    return nh.from_array(np.asarray(a, dtype=dtype), name)


def _model(nodes, inits, outputs, inputs=None):
    inputs = inputs or [
        h.make_tensor_value_info("scores", T.FLOAT, [N]),
        h.make_tensor_value_info("boxes", T.FLOAT, [N, 4]),
    ]
    g = h.make_graph(nodes, "detpost", inputs, outputs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _feed(seed=0, thr_frac=0.5):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(10, 60, (6, 2))  # clustered: NMS suppresses some
    xy = (centers[rng.integers(0, 6, N)] + rng.normal(0, 3, (N, 2))).astype(np.float32)
    wh = rng.uniform(8, 16, (N, 2)).astype(np.float32)
    return {
        "scores": rng.permutation(np.linspace(0.01, 0.99, N)).astype(np.float32),
        "boxes": np.concatenate([xy, xy + wh], 1).astype(np.float32),
    }


def _check(model, tmp_path, feeds):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    out = tmp_path / "m.kiln"
    res = kiln.compile(str(path), str(out), layout="NCHW")
    # NMS and sort are TOPI ir_builder kernels with no blocks: left as written, never a skipped pass
    assert not res.report.get("passes_skipped"), res.report["passes_skipped"]
    runner = kiln.load(str(out))
    sess = ort.InferenceSession(str(path))
    refs = []
    for feed in feeds:
        ref = sess.run(None, feed)
        refs.append(ref)
        ours = runner.run(feed)
        ours = list(ours.values()) if isinstance(ours, dict) else list(ours)
        assert len(ours) == len(ref)
        for k, r in zip(ours, ref):
            k = np.asarray(k)
            assert k.shape == r.shape, (k.shape, r.shape)
            assert k.dtype == r.dtype
            if r.dtype.kind in "iub":
                np.testing.assert_array_equal(k, r)
            else:
                np.testing.assert_allclose(k, r, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(r).max(initial=0))))
    return refs


def _candidates(limit):
    """scores > 0.3 -> NonZero -> gather -> TopK(k = min(count, limit)): nodes and constants."""
    nodes = [
        h.make_node("Greater", ["scores", "thr"], ["keep"]),
        h.make_node("NonZero", ["keep"], ["nz"]),
        h.make_node("Reshape", ["nz", "m1"], ["idx"]),
        h.make_node("Gather", ["scores", "idx"], ["s1"], axis=0),
        h.make_node("Gather", ["boxes", "idx"], ["b1"], axis=0),
        h.make_node("Shape", ["s1"], ["sh"]),
        h.make_node("Gather", ["sh", "zero"], ["n0"], axis=0),
        h.make_node("Unsqueeze", ["n0", "ax0"], ["n1"]),
        h.make_node("Concat", ["n1", "klim"], ["cat"], axis=0),
        h.make_node("ReduceMin", ["cat"], ["k"], keepdims=1),
        h.make_node("TopK", ["s1", "k"], ["tv", "ti"], axis=0),
        h.make_node("Gather", ["b1", "ti"], ["b2"], axis=0),
    ]
    inits = [
        _c("thr", 0.3, np.float32),
        _c("m1", [-1], np.int64),
        _c("zero", 0, np.int64),
        _c("ax0", [0], np.int64),
        _c("klim", [limit], np.int64),
    ]
    return nodes, inits


@pytest.mark.parametrize("limit", [10, 1000])  # k = the limit, k = every candidate
def test_threshold_topk_nms_gather(tmp_path, limit):
    nodes, inits = _candidates(limit)
    nodes += [
        # torchvision's batched NMS offsets each class's boxes: an Add of two run-time-sized tensors
        h.make_node("Cast", ["ti"], ["tif"], to=T.FLOAT),
        h.make_node("Mul", ["tif", "big"], ["off1"]),
        h.make_node("Unsqueeze", ["off1", "ax1"], ["off"]),
        h.make_node("Mul", ["off", "zerof"], ["off0"]),
        h.make_node("Add", ["b2", "off0"], ["b3"]),
        h.make_node("Unsqueeze", ["b3", "ax0"], ["b4"]),
        h.make_node("Unsqueeze", ["tv", "ax0"], ["s2"]),
        h.make_node("Unsqueeze", ["s2", "ax0"], ["s3"]),
        h.make_node("NonMaxSuppression", ["b4", "s3", "maxo", "iou"], ["sel"]),
        h.make_node("Gather", ["sel", "two"], ["keepi"], axis=1),
        h.make_node("Gather", ["b2", "keepi"], ["out_boxes"], axis=0),
        h.make_node("Gather", ["tv", "keepi"], ["out_scores"], axis=0),
        h.make_node("Gather", ["ti", "keepi"], ["out_idx"], axis=0),
    ]
    inits += [
        _c("big", [100.0], np.float32),
        _c("zerof", [0.0], np.float32),
        _c("ax1", [1], np.int64),
        _c("maxo", [9223372036854775807], np.int64),
        _c("iou", [0.5], np.float32),
        _c("two", 2, np.int64),
    ]
    m = _model(
        nodes,
        inits,
        [
            h.make_tensor_value_info("out_boxes", T.FLOAT, ["d", 4]),
            h.make_tensor_value_info("out_scores", T.FLOAT, ["d"]),
            h.make_tensor_value_info("out_idx", T.INT64, ["d"]),
        ],
    )
    for ref in _check(m, tmp_path, [_feed(0), _feed(1)]):
        assert 0 < ref[0].shape[0] < min(limit, N)  # NMS suppressed some candidates: the sizes really vary


def test_constant_of_shape_of_runtime_shape(tmp_path):
    nodes, inits = _candidates(20)
    nodes += [
        h.make_node("Shape", ["tv"], ["tsh"]),
        h.make_node("ConstantOfShape", ["tsh"], ["labels"], value=nh.from_array(np.array([3], np.int64))),
        h.make_node("Add", ["labels", "ti"], ["lab2"]),
        h.make_node("Shape", ["b2"], ["bsh"]),
        h.make_node("ConstantOfShape", ["bsh"], ["ones"], value=nh.from_array(np.array([1.5], np.float32))),
        h.make_node("Mul", ["ones", "b2"], ["scaled"]),
        h.make_node("Cast", ["bsh"], ["bshf"], to=T.FLOAT),
    ]
    m = _model(
        nodes,
        inits,
        [
            h.make_tensor_value_info("lab2", T.INT64, ["d"]),
            h.make_tensor_value_info("scaled", T.FLOAT, ["d", 4]),
            h.make_tensor_value_info("bshf", T.FLOAT, [2]),
        ],
    )
    _check(m, tmp_path, [_feed(0), _feed(2)])


def test_empty_candidates(tmp_path):
    """No score above the threshold: every run-time size is 0."""
    nodes, inits = _candidates(10)
    nodes += [
        h.make_node("Add", ["b2", "b2"], ["out_boxes"]),
        h.make_node("Identity", ["tv"], ["out_scores"]),
        h.make_node("Unsqueeze", ["b2", "ax0"], ["b4"]),
        h.make_node("Unsqueeze", ["tv", "ax01"], ["s3"]),
        h.make_node("NonMaxSuppression", ["b4", "s3", "maxo", "iou"], ["sel"]),
    ]
    inits += [_c("ax01", [0, 1], np.int64), _c("maxo", [9223372036854775807], np.int64), _c("iou", [0.5], np.float32)]
    m = _model(
        nodes,
        inits,
        [
            h.make_tensor_value_info("out_boxes", T.FLOAT, ["d", 4]),
            h.make_tensor_value_info("out_scores", T.FLOAT, ["d"]),
            h.make_tensor_value_info("sel", T.INT64, ["e", 3]),
        ],
    )
    low = _feed(0)
    low["scores"] = np.full(N, 0.1, np.float32)
    refs = _check(m, tmp_path, [low, _feed(1)])
    assert refs[0][0].shape == (0, 4) and refs[1][0].shape == (10, 4)


def test_whole_axis_slice_of_runtime_size(tmp_path):
    """x[:, None] of a run-time-sized tensor (a Slice 0..INT64_MAX, then Unsqueeze) added to a tensor of the
    same run-time size: TVM inferred the slice's length as min(INT32_MAX, k) - min(0, k), could not prove it k,
    and left the Add unlegalized (tvm.compile: "InternalError: R.add(alloc.., alloc..)")."""
    nodes, inits = _candidates(12)
    nodes += [
        h.make_node("Slice", ["tv", "s0", "smax", "ax0"], ["tvs"]),
        h.make_node("Unsqueeze", ["tvs", "ax1"], ["tvc"]),
        h.make_node("Add", ["b2", "tvc"], ["out"]),
        h.make_node("Slice", ["b2", "one", "smax", "ax0"], ["tail"]),  # a slice that is not the whole axis
    ]
    inits += [
        _c("s0", [0], np.int64),
        _c("one", [1], np.int64),
        _c("smax", [9223372036854775807], np.int64),
        _c("ax1", [1], np.int64),
    ]
    m = _model(
        nodes,
        inits,
        [h.make_tensor_value_info("out", T.FLOAT, ["d", 4]), h.make_tensor_value_info("tail", T.FLOAT, ["e", 4])],
    )
    _check(m, tmp_path, [_feed(0), _feed(3)])
