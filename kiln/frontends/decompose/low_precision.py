"""Softmax on float16/bfloat16 written out step by step, each step computed in float32 and rounded to the
input's type once: x - max, exp, the sum (accumulated in float32), the division. TVM 0.27's softmax
kernel accumulates the sum in the input's type, a rounding per addition; onnx's reference and onnxruntime
accumulate in float32, and with fp16's 2^-11 precision against the suite's 1e-3 tolerance the difference
fails fp16 attention (its function body takes a softmax in the input's type). Rounding after every step
(not one float32 softmax rounded at the end) is what the reference does too: a softmax kept in float32
throughout is more accurate but 2 ulps from it."""

from __future__ import annotations

import numpy as np
import onnx

from .emitter import Emitter
from .standard import value_elem_type

LOW = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
F32 = onnx.TensorProto.FLOAT


def _reduce(em: Emitter, op: str, x: str, axes: list[int]) -> str:
    """op over axes, kept; axes an input from opset 13 (ReduceSum) or 18 (ReduceMax)."""
    if em.opset >= (13 if op == "ReduceSum" else 18):
        return em.op(op, [x, em.const(np.array(axes, np.int64), "axes")], keepdims=1)
    return em.op(op, [x], axes=axes, keepdims=1)


def softmax_rounded_steps(node, em: Emitter, shapes, consts, where):
    low = value_elem_type(node.input[0], consts)
    if low not in LOW:
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    axis = attrs.get("axis", -1 if em.opset >= 13 else 1)
    shape = shapes.get(node.input[0])
    if em.opset >= 13:
        axes = [axis]
    elif shape is not None:  # opset < 13: the input seen as 2-D, the softmax over every axis from `axis` on
        axes = list(range(axis % len(shape), len(shape)))
    else:
        return False

    def rounded(x: str) -> str:  # float32 -> the input's type -> float32: one rounding
        return em.op("Cast", [em.op("Cast", [x], to=low)], to=F32)

    x = em.op("Cast", [node.input[0]], to=F32)
    shifted = rounded(em.op("Sub", [x, _reduce(em, "ReduceMax", x, axes)]))
    e = rounded(em.op("Exp", [shifted]))
    total = rounded(_reduce(em, "ReduceSum", e, axes))
    em.op("Cast", [em.op("Div", [e, total])], out=node.output[0], to=low)
    return None


REWRITES = {"Softmax": softmax_rounded_steps}
