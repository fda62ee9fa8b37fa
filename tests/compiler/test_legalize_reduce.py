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


@pytest.mark.parametrize("op,fill", [("ReduceMax", -np.inf), ("ReduceMin", np.inf)])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("shape", [(32, 128), (3, 5, 24), (6, 10), (1, 197, 768)])
def test_reduce_of_every_element(tmp_path, op, fill, keepdims, shape):
    """A reduction to one value (a dynamic quantizer's range) runs as vector-wide partial results and one
    reduction of those, scheduled, and still starts from -inf/+inf: an all-infinite tensor gives the
    infinity. (6, 10): no vector width divides the last axis, the one-stage reduction; (1, 197, 768): partial
    results per contiguous chunk (PARTIAL_CHUNKS), in parallel."""
    import kiln

    rng = np.random.default_rng(0)
    for x in (rng.standard_normal(shape).astype(np.float32), np.full(shape, fill, np.float32)):
        m = make_model([helper.make_node(op, ["x"], ["m"], keepdims=keepdims)], {"x": x}, ["m"], {}, opset=13)
        out = check_against_ort(m, {"x": x}, tmp_path)
        assert out["m"].reshape(-1)[0] == (x.max() if op == "ReduceMax" else x.min())
    r = kiln.compile(m, tmp_path / "r.kiln")
    assert r.report["kernels_unscheduled"] == (1 if shape == (6, 10) and not keepdims else 0)


def test_sum_of_every_element_is_split_by_the_rule(tmp_path):
    """topi's sum to one value (identity 0, which TVM's rfactor knows): the reduction rule splits it into
    vector-wide partial sums itself."""
    import kiln

    x = np.random.default_rng(1).standard_normal((32, 128)).astype(np.float32)
    m = make_model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)], {"x": x}, ["s"], {}, opset=13)
    check_against_ort(m, {"x": x}, tmp_path, rtol=1e-4, atol=1e-3)
    assert kiln.compile(m, tmp_path / "s.kiln").report["kernels_unscheduled"] == 0
