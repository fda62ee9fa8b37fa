"""ai.onnx.ml's tensor-arithmetic ops (Binarizer, ArrayFeatureExtractor) and boolean ReduceMax/ReduceMin
(any/all), each against onnxruntime."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import TensorProto, helper


def _ml_model(node, inputs, out_type):
    g = helper.make_graph(
        [node],
        "ml",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in inputs.items()
        ],
        [helper.make_tensor_value_info(node.output[0], out_type, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])


def test_binarizer_and_array_feature_extractor(tmp_path):
    x = rand(3, 4)
    check_against_ort(
        _ml_model(
            helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.2), {"x": x}, TensorProto.FLOAT
        ),
        {"x": x},
        tmp_path,
    )
    idx = np.array([0, 3], np.int64)
    check_against_ort(
        _ml_model(
            helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml"),
            {"x": x, "i": idx},
            TensorProto.FLOAT,
        ),
        {"x": x, "i": idx},
        tmp_path,
    )


@pytest.mark.filterwarnings("error::kiln.errors.KilnWarning")  # no pass skipped (FoldConstants once was)
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_boolean_reduce(tmp_path, op):
    x = np.array([[True, False, True], [True, True, True], [False, False, False]])
    m = make_model(
        [helper.make_node(op, ["x", "ax"], ["y"], keepdims=0)],
        {"x": x},
        ["y"],
        {"ax": np.array([1], np.int64)},
        opset=20,
    )  # bool reductions: opset 20
    check_against_ort(m, {"x": x}, tmp_path)
