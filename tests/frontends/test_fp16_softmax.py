"""float16 Softmax (decompose/low_precision.py) and fp16 Attention, whose function body takes it, against
onnx's reference (which made the backend suite's expected outputs) to one fp16 ulp, which the suite's 1e-3
tolerance needs (TVM's softmax kernel summed in float16 was 2 ulps off); attention against onnxruntime too,
loosely: its fp16 kernels are themselves several ulps from the reference."""

import numpy as np
import pytest
from helpers import compile_and_run, ort_run
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

F16 = TensorProto.FLOAT16


def _model(node, inputs: dict, opset: int):
    g = helper.make_graph(
        [node],
        "fp16",
        [helper.make_tensor_value_info(k, F16, v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", F16, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check_one_ulp(model, feeds, tmp_path, with_ort=False):
    ours = compile_and_run(model, feeds, tmp_path)["y"]
    assert ours.dtype == np.float16
    if with_ort:  # onnxruntime's fp16 kernels round differently from the reference: several ulps apart
        np.testing.assert_allclose(ours, ort_run(model, feeds)[0], rtol=0, atol=4e-3)
    for ref in [ReferenceEvaluator(model).run(None, feeds)[0]]:
        ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float32)
        np.testing.assert_array_less(np.abs(ours.astype(np.float32) - ref.astype(np.float32)), 1.01 * ulp + 1e-7)


def test_fp16_softmax(tmp_path):
    x = (np.random.default_rng(0).standard_normal((2, 3, 4, 40)) * 3).astype(np.float16)
    _check_one_ulp(_model(helper.make_node("Softmax", ["x"], ["y"], axis=-1), {"x": x}, 17), {"x": x}, tmp_path)


def test_fp16_softmax_opset11_flattens(tmp_path):
    """Before opset 13 Softmax normalizes over every axis from `axis` on (onnx's reference evaluator does
    not): checked against the reference's fp16 numpy arithmetic on the flattened input, to one ulp."""
    x = (np.random.default_rng(0).standard_normal((3, 5, 6)) * 3).astype(np.float16)
    m = _model(helper.make_node("Softmax", ["x"], ["y"], axis=1), {"x": x}, 11)
    ours = compile_and_run(m, {"x": x}, tmp_path)["y"].astype(np.float32)
    flat = x.reshape(3, 30)
    e = np.exp(flat - flat.max(axis=1, keepdims=True))  # float16 throughout, as numpy computes it
    want = (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)
    ulp = np.spacing(want).astype(np.float32)
    np.testing.assert_array_less(np.abs(ours - want.astype(np.float32)), 1.01 * ulp + 1e-7)


@pytest.mark.parametrize("causal", [0, 1])
def test_fp16_attention(tmp_path, causal):
    """Causal with fewer queries than keys: onnxruntime 1.32 aligns the mask top-left, the spec (and its
    reference) bottom-right, so that one is held to the reference only."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, s, 8)).astype(np.float16) for s in (4, 6, 6))
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=causal)
    feeds = {"q": q, "k": k, "v": v}
    _check_one_ulp(_model(node, feeds, 23), feeds, tmp_path, with_ort=not causal)
