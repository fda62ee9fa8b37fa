"""Scalars that decide no shape stay run-time inputs (issue 51): NonMaxSuppression's limit and thresholds,
Pad's fill value, Clip's bounds, Dropout's ratio compile as ordinary inputs and match onnxruntime for every
value fed; an input that decides a shape is still refused, and the error says it decides a shape."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, ort_run, rand
from onnx import helper

import kiln


def _nms_model(center: int = 0):
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 10, (2, 40, 2)).astype(np.float32)
    wh = rng.uniform(1, 4, (2, 40, 2)).astype(np.float32)
    boxes = np.concatenate([xy + wh / 2, wh] if center else [xy, xy + wh], -1)
    feeds = {
        "boxes": boxes,
        "scores": rng.uniform(0, 1, (2, 3, 40)).astype(np.float32),
        "max_out": np.array([5], np.int64),
        "iou": np.array([0.3], np.float32),
        "score_t": np.array([0.2], np.float32),
    }
    node = helper.make_node(
        "NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_t"], ["sel"], center_point_box=center
    )
    return make_model([node], feeds, ["sel"]), feeds


@pytest.mark.parametrize("center", [0, 1])
def test_nms_thresholds_and_limit_are_run_time_inputs(tmp_path, center):
    m, feeds = _nms_model(center)
    r = kiln.compile(m, tmp_path / "m.kiln")
    assert [i["name"] for i in r.manifest["inputs"]] == ["boxes", "scores", "max_out", "iou", "score_t"]
    art = kiln.load(tmp_path / "m.kiln")
    counts = []
    for limit, iou, score in [(5, 0.3, 0.2), (2, 0.5, 0.0), (100, 0.1, 0.6), (0, 0.5, 0.1), (40, 1.0, -1.0)]:
        f = dict(
            feeds,
            max_out=np.array([limit], np.int64),
            iou=np.array([iou], np.float32),
            score_t=np.array([score], np.float32),
        )
        ours, ref = art.run(f)["sel"], ort_run(m, f)[0]
        assert ours.dtype == ref.dtype == np.int64
        np.testing.assert_array_equal(ours, ref)  # indices: exact
        counts.append(len(ref))
    assert len(set(counts)) == len(counts)  # each setting selected a different number of boxes: all were read


@pytest.mark.parametrize("limit", ["input", "constant"])
def test_what_reads_nms_rows_sees_only_the_rows_kept(tmp_path, limit):
    """The selected indices' row count is the run's, not the rows allocated (batch * classes * limit): a
    detector's post-processing (torch.onnx.export of scores[sel[:, 1], sel[:, 2]]) gathers from a flattened
    score map and reshapes the result to -1. Typed with the allocated rows (240 here; 30 with a constant limit),
    that Reshape made that many values from the kept ones, the rest read past them (issue 51's SSDlite with its
    thresholds as inputs)."""
    m, feeds = _nms_model()
    if limit == "constant":
        del feeds["max_out"]
    nodes = [
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_t"], ["sel"]),
        helper.make_node("Gather", ["sel", "one"], ["cls"], axis=1),
        helper.make_node("Gather", ["sel", "two"], ["box"], axis=1),
        helper.make_node("Mul", ["cls", "n"], ["row"]),
        helper.make_node("Add", ["row", "box"], ["at"]),
        helper.make_node("Gather", ["scores", "zero"], ["s0"], axis=0),
        helper.make_node("Flatten", ["s0"], ["flat"], axis=2),  # (classes * boxes, 1)
        helper.make_node("Gather", ["flat", "at"], ["picked"], axis=0),
        helper.make_node("Reshape", ["picked", "minus_one"], ["kept"]),
    ]
    inits = {"one": np.array(1), "two": np.array(2), "n": np.array(40), "zero": np.array(0), "minus_one": [-1]}
    inits = {k: np.asarray(v, np.int64) for k, v in inits.items()}
    if limit == "constant":
        inits["max_out"] = np.array([5], np.int64)
    m = make_model(nodes, feeds, ["kept", "sel"], inits)
    art = kiln.compile(m, tmp_path / "m.kiln") and kiln.load(tmp_path / "m.kiln")
    for score in (0.2, 0.7):
        f = dict(feeds, score_t=np.array([score], np.float32))
        ours, ref = art.run(f), ort_run(m, f)
        np.testing.assert_array_equal(ours["sel"], ref[1])
        assert ours["kept"].shape == ref[0].shape  # as many values as rows kept, not allocated
        np.testing.assert_allclose(ours["kept"], ref[0], rtol=1e-6)


def test_nms_over_a_run_time_box_count_after_topk(tmp_path):
    """RetinaNet's pattern: the candidates are a TopK with a run-time k, so the box count is symbolic and NMS's
    rows are typed by it while the kernel allocates for its static bound: the rows kept, as onnxruntime's."""
    m, feeds = _nms_model()
    feeds = {"boxes": feeds["boxes"][:1], "scores": feeds["scores"][:1, :1], "k": np.array([25], np.int64)}
    nodes = [
        helper.make_node("TopK", ["scores", "k"], ["top", "at"], axis=2),
        helper.make_node("Squeeze", ["at", "axes"], ["at1"]),
        helper.make_node("Gather", ["boxes", "at1"], ["cand"], axis=1),
        helper.make_node("NonMaxSuppression", ["cand", "top", "max_out", "iou", "score_t"], ["sel"]),
    ]
    inits = {"axes": np.array([0, 1], np.int64), "max_out": np.array([100], np.int64)}
    inits.update(iou=np.array([0.3], np.float32), score_t=np.array([0.1], np.float32))
    m = make_model(nodes, feeds, ["sel"], inits)
    art = kiln.compile(m, tmp_path / "m.kiln") and kiln.load(tmp_path / "m.kiln")
    for k in (25, 40, 3):
        f = dict(feeds, k=np.array([k], np.int64))
        np.testing.assert_array_equal(art.run(f)["sel"], ort_run(m, f)[0])


def test_nms_run_time_limit_over_a_run_time_box_count_is_refused(tmp_path):
    """The boxes kept by a score filter (Compress): their count is known only at run time, so a run-time
    limit has no static size to allocate the selected rows for; the error says how to fix it."""
    _, feeds = _nms_model()
    feeds = dict(feeds, boxes=feeds["boxes"][:1], scores=feeds["scores"][:1, :1])
    nodes = [
        helper.make_node("Reshape", ["scores", "flat"], ["s1"]),
        helper.make_node("Greater", ["s1", "score_t"], ["keep"]),
        helper.make_node("Compress", ["boxes", "keep"], ["b2"], axis=1),
        helper.make_node("Compress", ["scores", "keep"], ["s2"], axis=2),
        helper.make_node("NonMaxSuppression", ["b2", "s2", "max_out", "iou"], ["sel"]),
    ]
    m = make_model(nodes, feeds, ["sel"], {"flat": np.array([-1], np.int64)})
    with pytest.raises(kiln.UnsupportedModelError, match="run-time max_output_boxes_per_class") as e:
        kiln.compile(m, tmp_path / "m.kiln")
    assert "--freeze-input" in e.value.fix


def test_pad_fill_value_is_a_run_time_input(tmp_path):
    x = rand(2, 3, 4)
    m = make_model(
        [helper.make_node("Pad", ["x", "pads", "v"], ["y"])],
        {"x": x, "v": np.array(2.5, np.float32)},
        ["y"],
        {"pads": np.array([0, 1, 2, 0, 2, 1], np.int64)},
    )
    outs = [check_against_ort(m, {"x": x, "v": np.array(v, np.float32)}, tmp_path, rtol=0, atol=0) for v in (2.5, -7)]
    assert outs[0]["y"][0, 0, 0] == 2.5 and outs[1]["y"][0, 0, 0] == -7


def test_clip_bounds_and_dropout_ratio_are_run_time_inputs(tmp_path):
    x = rand(2, 3, 4)
    feeds = {"x": x, "lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32), "r": np.array(0.3, np.float32)}
    m = make_model(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]), helper.make_node("Dropout", ["c", "r"], ["y", "mask"])],
        feeds,
        ["y", "mask"],
    )
    out = check_against_ort(m, feeds, tmp_path, rtol=0, atol=0)
    assert out["y"].max() == np.float32(0.7) and out["y"].min() == np.float32(-0.5)
    other = dict(feeds, lo=np.array(-2, np.float32), hi=np.array(0.1, np.float32))
    check_against_ort(m, other, tmp_path, rtol=0, atol=0)


def test_the_error_says_which_input_decides_a_shape(tmp_path):
    m = make_model(
        [helper.make_node("OneHot", ["idx", "n", "vals"], ["r"]), helper.make_node("Mul", ["r", "s"], ["y"])],
        {"n": np.array(4, np.int64), "s": np.array(2, np.float32)},
        ["y"],
        {"idx": np.array([1, 3], np.int64), "vals": np.array([0, 1], np.float32)},
    )
    with pytest.raises(kiln.UnsupportedModelError, match=r"input 1 \('n'.*decides the output's shape") as e:
        kiln.compile(m, tmp_path / "m.kiln")
    assert "'s'" not in str(e.value) and "need no freezing" in e.value.fix
    kiln.compile(m, tmp_path / "m.kiln", freeze_inputs={"n": 4})
    for s in (3.0, -0.5):  # the frozen depth, and s fed at run time
        ours = kiln.load(tmp_path / "m.kiln").run({"s": np.array(s, np.float32)})
        ref = ort_run(m, {"n": np.array(4, np.int64), "s": np.array(s, np.float32)})
        np.testing.assert_allclose(ours["y"], ref[0], rtol=1e-6)
