"""ReduceMax/ReduceMin of float rows start from -inf/+inf, as ONNX's do: topi's start from the lowest /
highest finite value, so a fully masked attention row (all -inf) never tested equal to -inf and gave NaN."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model
from onnx import helper


@pytest.mark.parametrize("op,fill", [("ReduceMax", -np.inf), ("ReduceMin", np.inf)])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_of_infinite_rows(tmp_path, op, fill, keepdims):
    x = np.array([[1.0, fill, 2.0], [fill, fill, fill]], np.float32)
    m = make_model(
        [helper.make_node(op, ["x"], ["m"], axes=[1], keepdims=keepdims), helper.make_node("Equal", ["m", "v"], ["e"])],
        {"x": x},
        ["m", "e"],
        {"v": np.float32(fill)},
        opset=13,
    )
    out = check_against_ort(m, {"x": x}, tmp_path)
    assert out["e"].reshape(-1).tolist() == [False, True]
