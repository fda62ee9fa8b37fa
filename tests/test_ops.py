"""One numerics test per supported op family: Kiln's compiled output against onnxruntime."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import helper

X4 = rand(1, 8, 10, 10)


def one(op, inputs, inits=None, n_out=1, **attrs):
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, list(inputs) + list(inits or {}), outs, **attrs)
    return make_model([node], inputs, outs, inits)


@pytest.mark.parametrize(
    "group,stride,pads", [(1, 1, [1, 1, 1, 1]), (1, 2, [0, 0, 1, 1]), (8, 1, [1, 1, 1, 1]), (2, 2, [1, 1, 1, 1])]
)
def test_conv(tmp_path, group, stride, pads):
    m = one(
        "Conv",
        {"x": X4},
        {"w": rand(16, 8 // group, 3, 3, seed=1), "b": rand(16, seed=2)},
        group=group,
        strides=[stride, stride],
        pads=pads,
    )
    check_against_ort(m, {"x": X4}, tmp_path)


def test_conv_transpose(tmp_path):
    m = one(
        "ConvTranspose",
        {"x": X4},
        {"w": rand(8, 4, 3, 3, seed=1)},
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        output_padding=[1, 1],
    )
    check_against_ort(m, {"x": X4}, tmp_path)


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2])),
        ("GlobalAveragePool", {}),
        ("GlobalMaxPool", {}),
    ],
)
def test_pooling(tmp_path, op, attrs):
    check_against_ort(one(op, {"x": X4}, **attrs), {"x": X4}, tmp_path)


def test_gemm_matmul_batched(tmp_path):
    a, b = rand(2, 3, 5, 7), rand(2, 3, 7, 4, seed=1)
    check_against_ort(one("MatMul", {"a": a, "b": b}), {"a": a, "b": b}, tmp_path)
    x = rand(4, 6)
    m = one("Gemm", {"x": x}, {"w": rand(5, 6, seed=3), "c": rand(5, seed=4)}, transB=1, alpha=0.5, beta=2.0)
    check_against_ort(m, {"x": x}, tmp_path / "g")


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("Relu", {}),
        ("Sigmoid", {}),
        ("Tanh", {}),
        ("Erf", {}),
        ("Exp", {}),
        ("HardSwish", {}),
        ("LeakyRelu", {"alpha": 0.1}),
        ("Elu", {}),
        ("Softplus", {}),
        ("Gelu", {}),
        ("Abs", {}),
        ("Neg", {}),
    ],
)
def test_unary_activations(tmp_path, op, attrs):
    opset = 20 if op == "Gelu" else 17
    node = helper.make_node(op, ["x"], ["y0"], **attrs)
    check_against_ort(make_model([node], {"x": X4}, ["y0"], opset=opset), {"x": X4}, tmp_path)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"])
def test_binary_broadcast(tmp_path, op):
    a, b = np.abs(rand(2, 3, 4)) + 0.5, np.abs(rand(3, 1, seed=1)) + 0.5
    check_against_ort(one(op, {"a": a, "b": b}), {"a": a, "b": b}, tmp_path)


def test_clip_relu6(tmp_path):
    m = one("Clip", {"x": X4 * 4}, {"lo": np.float32(0), "hi": np.float32(6)})
    check_against_ort(m, {"x": X4 * 4}, tmp_path)


def test_normalizations(tmp_path):
    c = 8
    bn = one(
        "BatchNormalization",
        {"x": X4},
        {"g": rand(c, seed=1), "b": rand(c, seed=2), "m": rand(c, seed=3), "v": np.abs(rand(c, seed=4)) + 0.5},
    )
    check_against_ort(bn, {"x": X4}, tmp_path / "bn")
    ln = one("LayerNormalization", {"x": X4}, {"g": rand(10, seed=1), "b": rand(10, seed=2)}, axis=-1)
    check_against_ort(ln, {"x": X4}, tmp_path / "ln")
    inorm = one("InstanceNormalization", {"x": X4}, {"g": rand(c, seed=1), "b": rand(c, seed=2)})
    check_against_ort(inorm, {"x": X4}, tmp_path / "in")


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(tmp_path, op):
    check_against_ort(one(op, {"x": X4}, axis=-1), {"x": X4}, tmp_path)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
def test_reductions(tmp_path, op):
    if op == "ReduceSum":
        m = one(op, {"x": X4}, {"axes": np.array([1, 3], np.int64)}, keepdims=0)
    else:
        m = one(op, {"x": X4}, axes=[1, 3], keepdims=1)
    check_against_ort(m, {"x": X4}, tmp_path)


def test_shape_ops(tmp_path):
    x = rand(2, 3, 4, 5)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Slice", ["r", "st", "en", "ax"], ["s"]),
        helper.make_node("Concat", ["s", "s"], ["c"], axis=1),
        helper.make_node("Unsqueeze", ["c", "ax0"], ["u"]),
        helper.make_node("Squeeze", ["u", "ax0"], ["q"]),
        helper.make_node("Gather", ["q", "idx"], ["g"], axis=1),
        helper.make_node("Pad", ["g", "pads"], ["p"], mode="constant"),
        helper.make_node("Expand", ["p", "eshape"], ["e"]),
        helper.make_node("Split", ["e", "split"], ["y0", "y1"], axis=3),
        helper.make_node("Flatten", ["x"], ["y2"], axis=2),
    ]
    inits = {
        "shape": np.array([2, 4, 15], np.int64),
        "st": np.array([1], np.int64),
        "en": np.array([13], np.int64),
        "ax": np.array([2], np.int64),
        "ax0": np.array([0], np.int64),
        "idx": np.array([0, 3, 5], np.int64),
        "pads": np.array([0, 1, 0, 0, 1, 2], np.int64),
        "eshape": np.array([3, 1, 1, 1], np.int64),
        "split": np.array([5, 9], np.int64),
    }
    check_against_ort(make_model(nodes, {"x": x}, ["y0", "y1", "y2"], inits), {"x": x}, tmp_path)


def test_resize_and_where(tmp_path):
    x = rand(1, 2, 4, 4)
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["y0"], mode="nearest"),
        helper.make_node("Greater", ["x", "zero"], ["m"]),
        helper.make_node("Where", ["m", "x", "zero"], ["y1"]),
    ]
    m = make_model(nodes, {"x": x}, ["y0", "y1"], {"scales": np.array([1, 1, 2, 2], np.float32), "zero": np.float32(0)})
    check_against_ort(m, {"x": x}, tmp_path)


def test_integer_and_cast(tmp_path):
    x = rand(3, 4)
    nodes = [
        helper.make_node("ArgMax", ["x"], ["y0"], axis=1, keepdims=0),
        helper.make_node("Cast", ["x"], ["xi"], to=7),
        helper.make_node("Add", ["xi", "one"], ["y1"]),
    ]
    m = make_model(nodes, {"x": x * 10}, ["y0", "y1"], {"one": np.int64(1)})
    check_against_ort(m, {"x": x * 10}, tmp_path)
