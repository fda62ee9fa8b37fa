"""Small real models to mutate: each compiles and runs before mutation."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _w(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(
        nodes,
        "seed",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def conv_net() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"], axis=1),
    ]
    inits = {
        "w": _w(4, 3, 3, 3),
        "b": _w(4, seed=1),
        "s": _w(4, seed=2),
        "bb": _w(4, seed=3),
        "m": _w(4, seed=4),
        "v": np.abs(_w(4, seed=5)) + 0.5,
    }
    return _model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 4])], inits)


def mlp() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["l"]),
        helper.make_node("Softmax", ["l"], ["y"], axis=-1),
    ]
    return _model(
        nodes,
        [("x", [2, 16])],
        [("y", [2, 8])],
        {"w1": _w(32, 16), "b1": _w(32, seed=1), "w2": _w(32, 8, seed=2), "b2": _w(8, seed=3)},
    )


def reshaper() -> onnx.ModelProto:
    """Shape arithmetic as exporters write it: Shape -> Gather -> Concat -> Reshape, plus Transpose."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "tail"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("ReduceMean", ["t"], ["y"], keepdims=0, axes=[2]),
    ]
    inits = {"i0": np.array([0], np.int64), "tail": np.array([4, 6], np.int64)}
    return _model(nodes, [("x", [3, 24])], [("y", [3, 6])], inits)


SEEDS = {"conv_net": conv_net, "mlp": mlp, "reshaper": reshaper}
