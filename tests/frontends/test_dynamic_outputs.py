"""Outputs whose size depends on the data (NonZero, NMS, Unique) compile: their dims are -1 in the
manifest and TVM's VM sizes them per run. Op inputs TVM needs as constants (a TopK's k) that come
from a graph input are refused up front, naming the --freeze-input that fixes it."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model
from onnx import helper

import kiln


def test_nonzero_output_sized_per_run(tmp_path):
    x = np.array([[0, 1, 0, 2], [3, 0, 0, 0], [0, 0, 5, 0]], np.float32)
    m = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("NonZero", ["r"], ["y"]),
            helper.make_node("Transpose", ["y"], ["z"]),
        ],
        {"x": x},
        ["z"],
    )
    r = kiln.compile(m, tmp_path / "m.kiln")
    assert r.manifest["outputs"] == [{"name": "z", "shape": [-1, -1], "dtype": "int64"}]
    assert check_against_ort(m, {"x": x}, tmp_path)["z"].shape == (4, 2)
    assert check_against_ort(m, {"x": -x}, tmp_path)["z"].shape == (0, 2)


def test_a_shape_deciding_graph_input_names_the_freeze_flag(tmp_path):
    """OneHot's depth decides the output's length and TVM needs it as a constant: refused, naming the flag."""
    m = make_model(
        [helper.make_node("OneHot", ["idx", "n", "vals"], ["y"])],
        {"n": np.array(4, np.int64)},
        ["y"],
        {"idx": np.array([0, 2], np.int64), "vals": np.array([0, 1], np.float32)},
    )
    with pytest.raises(
        kiln.UnsupportedModelError, match=r"OneHot node .* input 1 \('n', from graph input\(s\) \['n'\]\)"
    ) as e:
        kiln.compile(m, tmp_path / "m.kiln")
    assert "--freeze-input n=VALUE" in e.value.fix
    kiln.compile(m, tmp_path / "m.kiln", freeze_inputs={"n": 4})
    out = kiln.load(tmp_path / "m.kiln").run({})
    np.testing.assert_array_equal(out["y"], [[1, 0, 0, 0], [0, 0, 1, 0]])


def test_topk_k_fed_at_run_time(tmp_path):
    """k decides the output's length, but the rank is static: a symbolic dim sized per run (tvm_converters.py)."""
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    m = make_model(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0)],
        {"x": x, "k": np.array([2], np.int64)},
        ["v", "i"],
    )
    for k in (2, 5, 0):
        out = check_against_ort(m, {"x": x, "k": np.array([k], np.int64)}, tmp_path, rtol=0, atol=0)
        assert out["v"].shape == (3, k)


def test_to_the_end_slice_of_run_time_dims_is_planned_at_run_time(tmp_path):
    """Slice(end=INT64_MAX, step 2) of run-time-sized axes: TVM inferred min(INT32_MAX, n) and Relax's memory
    planner took INT32_MAX as the bound, sizing this buffer at 2^62 bytes (std::bad_alloc; the corpus
    FasterRCNN's box decoding). The slice now ends at n itself, so the buffer is sized per run."""
    x = np.array([[0, 1, 0, 2, 7], [3, 0, 0, 0, 1]], np.float32)
    big = np.iinfo(np.int64).max
    m = make_model(
        [
            helper.make_node("NonZero", ["x"], ["nz"]),
            helper.make_node("Cast", ["nz"], ["f"], to=1),
            helper.make_node("Slice", ["f", "s0", "e1", "a0"], ["row"]),
            helper.make_node("Transpose", ["row"], ["col"]),
            helper.make_node("MatMul", ["col", "row"], ["outer"]),
            helper.make_node("Slice", ["outer", "s00", "emax", "a01", "st2"], ["y"]),
        ],
        {"x": x},
        ["y"],
        inits={
            "s0": np.array([1], np.int64),
            "e1": np.array([2], np.int64),
            "a0": np.array([0], np.int64),
            "s00": np.array([0, 0], np.int64),
            "emax": np.array([big, big], np.int64),
            "a01": np.array([0, 1], np.int64),
            "st2": np.array([2, 2], np.int64),
        },
    )
    assert check_against_ort(m, {"x": x}, tmp_path)["y"].shape == (3, 3)
