"""float16 Conv accumulated in float32 (tvm_conv_fp16.py) against onnxruntime, which accumulates so too: 1-D
depthwise (CausalConvWithState's body) and 2-D with bias, padding and groups, to one fp16 ulp."""

import numpy as np
import pytest
from helpers import compile_and_run, ort_run
from onnx import TensorProto, helper, numpy_helper

F16 = TensorProto.FLOAT16


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs, bias",
    [
        ((2, 4, 11), (4, 1, 4), dict(group=4), False),
        ((1, 8, 9, 9), (6, 4, 3, 3), dict(group=2, pads=[1, 1, 1, 1], strides=[2, 1]), True),
    ],
)
def test_fp16_conv(tmp_path, x_shape, w_shape, attrs, bias):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float16)
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float16), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float16), "b"))
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    g = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", F16, x_shape)],
        [helper.make_tensor_value_info("y", F16, None)], inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ours, ref = compile_and_run(m, {"x": x}, tmp_path)["y"], ort_run(m, {"x": x})[0]
    assert ours.dtype == np.float16 and ours.shape == ref.shape
    ulp = np.spacing(np.abs(ref)).astype(np.float32)
    np.testing.assert_array_less(np.abs(ours.astype(np.float32) - ref.astype(np.float32)), 1.01 * ulp + 1e-7)
