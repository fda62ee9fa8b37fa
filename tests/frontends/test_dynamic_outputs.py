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
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = make_model(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)], {"x": x, "k": np.array([2], np.int64)}, ["v", "i"]
    )
    with pytest.raises(
        kiln.UnsupportedModelError, match=r"TopK node .* input 1 \('k', from graph input\(s\) \['k'\]\)"
    ) as e:
        kiln.compile(m, tmp_path / "m.kiln")
    assert "--freeze-input k=VALUE" in e.value.fix
    kiln.compile(m, tmp_path / "m.kiln", freeze_inputs={"k": [2]})
    out = kiln.load(tmp_path / "m.kiln").run({"x": x})
    np.testing.assert_array_equal(out["v"], [[3, 2], [7, 6], [11, 10]])
