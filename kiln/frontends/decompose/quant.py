"""The QOperator forms of quantized ONNX models (QLinearConv, QLinearMatMul, ConvInteger,
MatMulInteger, and onnxruntime's QLinearAdd/QLinearMul/QLinearGlobalAveragePool) as the QDQ form
TVM imports: DequantizeLinear -> float op -> QuantizeLinear. The compiler's LowerQDQ pass then
turns each DQ -> Conv/MatMul back into an integer kernel, so nothing runs as fake quantization
where an int8 kernel exists."""

from __future__ import annotations

import numpy as np
import onnx

from ...errors import UnsupportedModelError
from .emitter import Emitter


def node_attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def node_inputs(node, n: int) -> list[str]:
    return list(node.input) + [""] * (n - len(node.input))


def emit_dequantize(em: Emitter, x: str, scale: str, zero: str, axis: int | None = None) -> str:
    kw = {"axis": axis} if axis is not None else {}
    return em.op("DequantizeLinear", [x, scale, zero] if zero else [x, scale], "dq", **kw)


def emit_quantize(em: Emitter, y: str, scale: str, zero: str, out: str) -> str:
    return em.op("QuantizeLinear", [y, scale, zero] if zero else [y, scale], out=out)


def per_axis(consts, name: str) -> bool:
    return name in consts and np.asarray(consts[name]).size > 1


def qlinear_conv(node, em: Emitter, shapes, consts, where):
    x, xs, xz, w, ws, wz, ys, yz, b = node_inputs(node, 9)
    xf = emit_dequantize(em, x, xs, xz)
    wf = emit_dequantize(em, w, ws, wz, 0 if per_axis(consts, ws) else None)
    ins = [xf, wf]
    if b:
        if b not in consts or xs not in consts or ws not in consts:
            raise UnsupportedModelError(
                "QLinearConv with a non-constant bias or scales is not supported",
                where=f"{where}: node {node.name!r}",
                fix="export the model with constant bias and scales",
            )
        ins.append(
            em.const(
                (consts[b].astype(np.float64) * np.float64(consts[xs]) * consts[ws].astype(np.float64)).astype(
                    np.float32
                ),
                "bias",
            )
        )
    y = em.op("Conv", ins, "conv", **node_attrs(node))
    emit_quantize(em, y, ys, yz, node.output[0])


def qlinear_matmul(node, em: Emitter, shapes, consts, where):
    a, as_, az, b, bs, bz, ys, yz = node_inputs(node, 8)
    y = em.op(
        "MatMul",
        [emit_dequantize(em, a, as_, az), emit_dequantize(em, b, bs, bz, 1 if per_axis(consts, bs) else None)],
        "matmul",
    )
    emit_quantize(em, y, ys, yz, node.output[0])


def _integer(op_type: str):
    """ConvInteger / MatMulInteger: int32 output of (x - xz) * (w - wz), as DQ with scale 1."""

    def rewrite(node, em: Emitter, shapes, consts, where):
        x, w, xz, wz = node_inputs(node, 4)
        one = em.const(np.float32(1.0), "one")
        waxis = (0 if op_type == "Conv" else 1) if per_axis(consts, wz) else None
        y = em.op(
            op_type,
            [emit_dequantize(em, x, one, xz), emit_dequantize(em, w, one, wz, waxis)],
            op_type.lower(),
            **node_attrs(node),
        )
        em.op("Cast", [y], out=node.output[0], to=onnx.TensorProto.INT32)

    return rewrite


def _binary(op_type: str):
    def rewrite(node, em: Emitter, shapes, consts, where):
        a, as_, az, b, bs, bz, cs, cz = node_inputs(node, 8)
        y = em.op(op_type, [emit_dequantize(em, a, as_, az), emit_dequantize(em, b, bs, bz)], op_type.lower())
        emit_quantize(em, y, cs, cz, node.output[0])

    return rewrite


def qlinear_global_average_pool(node, em: Emitter, shapes, consts, where):
    x, xs, xz, ys, yz = node_inputs(node, 5)
    if node_attrs(node).get("channels_last", 0):
        raise UnsupportedModelError(
            "QLinearGlobalAveragePool with channels_last is not supported",
            where=f"{where}: node {node.name!r}",
            fix="quantize the model in NCHW",
        )
    y = em.op("GlobalAveragePool", [emit_dequantize(em, x, xs, xz)], "gap")
    emit_quantize(em, y, ys, yz, node.output[0])


REWRITES = {
    "QLinearConv": qlinear_conv,
    "QLinearMatMul": qlinear_matmul,
    "ConvInteger": _integer("Conv"),
    "MatMulInteger": _integer("MatMul"),
}
CONTRIB_REWRITES = {
    "com.microsoft": {
        "QLinearAdd": _binary("Add"),
        "QLinearMul": _binary("Mul"),
        "QLinearGlobalAveragePool": qlinear_global_average_pool,
    }
}
