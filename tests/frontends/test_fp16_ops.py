"""float16 graphs: Elu (and Celu, whose function body is an Elu) with constants typed like the input
(TVM's converter mixed in a float32 constant), and fp16 MatMul summed in float32 as onnxruntime's
CPU kernels do."""

import numpy as np
from helpers import check_against_ort, ort_run
from onnx import TensorProto, helper, numpy_helper


def _fp16_model(nodes, x_shape, inits=None, opset=17):
    g = helper.make_graph(
        nodes,
        "f16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()] if inits else [],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_elu_in_fp16(tmp_path):
    x = (np.random.default_rng(0).standard_normal((3, 5)) * 2).astype(np.float16)
    for op, kw, opset in (
        ("Elu", {"alpha": 0.7}, 17),
        ("Elu", {"alpha": 1.3}, 22),
    ):  # (fp16 Celu: the conformance cases)
        check_against_ort(
            _fp16_model([helper.make_node(op, ["x"], ["y"], **kw)], [3, 5], opset=opset),
            {"x": x},
            tmp_path,
            rtol=1e-3,
            atol=1e-3,
        )


def test_fp16_matmul_sums_in_float32(tmp_path):
    r = np.random.default_rng(1)
    x, w = r.standard_normal((4, 256)).astype(np.float16), r.standard_normal((256, 8)).astype(np.float16)
    m = _fp16_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [4, 256], {"w": w})
    ours = check_against_ort(m, {"x": x}, tmp_path, rtol=1e-3, atol=1e-2)["y"]
    exact = (x.astype(np.float32) @ w.astype(np.float32)).astype(np.float16)
    assert (
        np.abs(ours.astype(np.float32) - exact.astype(np.float32)).max()
        <= np.abs(exact.astype(np.float32)).max() * 2e-3
    )
    assert ort_run(m, {"x": x})[0].dtype == np.float16
