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


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _ins(node, n: int) -> list[str]:
    return list(node.input) + [""] * (n - len(node.input))


def _dq(em: Emitter, x: str, scale: str, zero: str, axis: int | None = None) -> str:
    kw = {"axis": axis} if axis is not None else {}
    return em.op("DequantizeLinear", [x, scale, zero] if zero else [x, scale], "dq", **kw)


def _q(em: Emitter, y: str, scale: str, zero: str, out: str) -> str:
    return em.op("QuantizeLinear", [y, scale, zero] if zero else [y, scale], out=out)


def _per_axis(consts, name: str) -> bool:
    return name in consts and np.asarray(consts[name]).size > 1


def qlinear_conv(node, em: Emitter, shapes, consts, where):
    x, xs, xz, w, ws, wz, ys, yz, b = _ins(node, 9)
    xf = _dq(em, x, xs, xz)
    wf = _dq(em, w, ws, wz, 0 if _per_axis(consts, ws) else None)
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
    y = em.op("Conv", ins, "conv", **_attrs(node))
    _q(em, y, ys, yz, node.output[0])


def qlinear_matmul(node, em: Emitter, shapes, consts, where):
    a, as_, az, b, bs, bz, ys, yz = _ins(node, 8)
    y = em.op("MatMul", [_dq(em, a, as_, az), _dq(em, b, bs, bz, 1 if _per_axis(consts, bs) else None)], "matmul")
    _q(em, y, ys, yz, node.output[0])


def _integer(op_type: str):
    """ConvInteger / MatMulInteger: int32 output of (x - xz) * (w - wz), as DQ with scale 1."""

    def rewrite(node, em: Emitter, shapes, consts, where):
        x, w, xz, wz = _ins(node, 4)
        one = em.const(np.float32(1.0), "one")
        waxis = (0 if op_type == "Conv" else 1) if _per_axis(consts, wz) else None
        y = em.op(op_type, [_dq(em, x, one, xz), _dq(em, w, one, wz, waxis)], op_type.lower(), **_attrs(node))
        em.op("Cast", [y], out=node.output[0], to=onnx.TensorProto.INT32)

    return rewrite


def _binary(op_type: str):
    def rewrite(node, em: Emitter, shapes, consts, where):
        a, as_, az, b, bs, bz, cs, cz = _ins(node, 8)
        y = em.op(op_type, [_dq(em, a, as_, az), _dq(em, b, bs, bz)], op_type.lower())
        _q(em, y, cs, cz, node.output[0])

    return rewrite


def qlinear_global_average_pool(node, em: Emitter, shapes, consts, where):
    x, xs, xz, ys, yz = _ins(node, 5)
    if _attrs(node).get("channels_last", 0):
        raise UnsupportedModelError(
            "QLinearGlobalAveragePool with channels_last is not supported",
            where=f"{where}: node {node.name!r}",
            fix="quantize the model in NCHW",
        )
    y = em.op("GlobalAveragePool", [_dq(em, x, xs, xz)], "gap")
    _q(em, y, ys, yz, node.output[0])


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
