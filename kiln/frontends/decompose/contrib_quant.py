"""onnxruntime's quantized contrib ops (domain com.microsoft) as standard ONNX ops.

Static QOperator ops (QLinearSigmoid, QLinearLeakyRelu, QLinearConcat, QLinearAveragePool, QGemm;
from quantize_static with QuantFormat.QOperator) become DequantizeLinear -> float op -> QuantizeLinear,
the QDQ form Kiln's LowerQDQ pass turns back into integer kernels (QGemm's constant B is transposed
here so that it reaches LowerQDQ as DQ -> MatMul). MatMulIntegerToFloat (the graph optimizer's fusion
of MatMulInteger + Mul) becomes DQ(A) -> MatMul <- DQ(B), lowered to int8 when A's scale is constant.

Dynamic quantization (DynamicQuantizeMatMul, DynamicQuantizeLSTM) quantizes activations at run time,
exactly as onnxruntime does: the activation is quantized to uint8 with onnxruntime's parameters (range
widened to include 0, scale (max-min)/255 or 1 for an all-zero range, zero point round(-min/scale)).
With int8 weights and no weight zero point (onnxruntime's default), (q - zq) @ Wq is DQ(q, 1, zq) ->
MatMul <- DQ(Wq, 1), which LowerQDQ runs on the int8 kernel (the run-time zero point's correction
computed per row) and an int32 accumulator, scaled by sx*sw after, as onnxruntime's is. Other weights
run (q - zq) @ (Wq - zw) as a float MatMul over integer values (exact while the sums stay below 2^24).
Dequantizing the weight and multiplying in float instead would miss onnxruntime by the activation
rounding (~1e-2).

MatMulNBits (n-bit blockwise weights, from matmul_nbits_quantizer) is dequantized at compile time into
a float weight: blockwise scales fit no integer kernel Kiln has, and onnxruntime's default
accuracy_level 0 computes in float too."""

from __future__ import annotations

import numpy as np
import onnx

from .contrib import F32, fail
from .emitter import Emitter
from .quant import emit_dequantize, emit_quantize, node_attrs, node_inputs, per_axis
from .rnn import QuantizedWeights, decompose_lstm, one_kernel


def _unary(op_type: str, **defaults):
    def rewrite(node, em, shapes, consts, where):
        x, xs, xz, ys, yz = node_inputs(node, 5)
        attrs = {**defaults, **node_attrs(node)}
        y = em.op(op_type, [emit_dequantize(em, x, xs, xz)], op_type.lower(), **attrs)
        emit_quantize(em, y, ys, yz, node.output[0])

    return rewrite


def qlinear_concat(node, em, shapes, consts, where):
    ys, yz, *rest = node.input
    xs = [emit_dequantize(em, rest[i], rest[i + 1], rest[i + 2]) for i in range(0, len(rest), 3)]
    emit_quantize(em, em.op("Concat", xs, "concat", axis=node_attrs(node)["axis"]), ys, yz, node.output[0])


def qlinear_average_pool(node, em, shapes, consts, where):
    a = node_attrs(node)
    if a.pop("channels_last", 0):
        fail(node, where, "channels_last is not supported", "quantize the model in NCHW")
    x, xs, xz, ys, yz = node_inputs(node, 5)
    emit_quantize(em, em.op("AveragePool", [emit_dequantize(em, x, xs, xz)], "pool", **a), ys, yz, node.output[0])


def _const(node, consts, where, *names):
    for n in names:
        if n and n not in consts:
            fail(
                node, where, f"non-constant {n!r} is not supported", "export the model with constant weights and scales"
            )
    return [np.asarray(consts[n]) if n else None for n in names]


def qgemm(node, em, shapes, consts, where):
    """alpha * A' @ B' + C * sa*sb (C int32), quantized with y_scale or float output without it."""
    a_, as_, az, b, bs, bz, c, ys, yz = node_inputs(node, 9)
    at = node_attrs(node)
    alpha = float(at.get("alpha", 1.0))
    if alpha != 1.0 and c:
        fail(node, where, "alpha != 1 with a bias is not supported", "fold alpha into the weights")
    xa = emit_dequantize(em, a_, as_, az)
    if at.get("transA", 0):
        xa = em.op("Transpose", [xa], perm=[1, 0])
    bq, bsv = _const(node, consts, where, b, bs)
    axis = (0 if at.get("transB", 0) else 1) if bsv.size > 1 else None
    if at.get("transB", 0):
        bq, axis = np.ascontiguousarray(bq.T), (1 if axis is not None else None)
    y = em.op("MatMul", [xa, emit_dequantize(em, em.const(bq, "B"), bs, bz, axis)], "matmul")
    if c:
        cq, asv = _const(node, consts, where, c, as_)
        y = em.op("Add", [y, em.const((cq.astype(np.float64) * asv * bsv).astype(F32), "bias")])
    if alpha != 1.0:
        y = em.op("Mul", [y, em.const(F32(alpha))])
    if ys:
        emit_quantize(em, y, ys, yz, node.output[0])
    else:
        em.op("Identity", [y], out=node.output[0])


def matmul_integer_to_float(node, em, shapes, consts, where):
    """(A - za) sa @ (B - zb) sb + bias, as DQ -> MatMul."""
    a_, b, as_, bs, az, bz, bias = node_inputs(node, 7)
    rb = shapes[b] if b in shapes else (consts[b].shape if b in consts else None)
    axis = (len(rb) - 1 if rb is not None else -1) if per_axis(consts, bs) or per_axis(consts, bz) else None
    y = em.op("MatMul", [emit_dequantize(em, a_, as_, az), emit_dequantize(em, b, bs, bz, axis)], "matmul")
    em.op("Add", [y, bias], out=node.output[0]) if bias else em.op("Identity", [y], out=node.output[0])


def _dynamic_quant(em: Emitter, x: str):
    """x -> (q, zero point, scale), onnxruntime's uint8 parameters (see module doc); q and the zero point are
    integer-valued floats in [0, 255]."""
    c = lambda v: em.const(F32(v))
    hi = em.op("Max", [em.op("ReduceMax", [x], keepdims=0), c(0)])
    lo = em.op("Min", [em.op("ReduceMin", [x], keepdims=0), c(0)])
    rng = em.op("Sub", [hi, lo])
    scale = em.op("Where", [em.op("Equal", [rng, c(0)]), c(1), em.op("Div", [rng, c(255)])])
    zp = em.op("Round", [em.op("Min", [em.op("Max", [em.op("Neg", [em.op("Div", [lo, scale])]), c(0)]), c(255)])])
    q = em.op("Min", [em.op("Max", [em.op("Add", [em.op("Round", [em.op("Div", [x, scale])]), zp]), c(0)]), c(255)])
    return q, zp, scale


def _dyn_matmul(em: Emitter, x: str, wq: np.ndarray, zw, sw: np.ndarray, out: str | None = None) -> str:
    """x @ W with x quantized at run time; Wq (K, N) with zero point zw (None, scalar or per column), sw per
    column or scalar. int8 weights with no zero point (onnxruntime's default) become DQ(q, 1, zq) -> MatMul <-
    DQ(Wq, 1), which LowerQDQ runs on the int8 kernel (the zero point zq a run-time scalar); others run as a
    float MatMul over integer values."""
    q, zq, sx = _dynamic_quant(em, x)
    if wq.dtype == np.int8 and (zw is None or not np.any(zw)):
        u8 = onnx.TensorProto.UINT8
        one = em.const(F32(1.0), "one")
        xf = em.op("DequantizeLinear", [em.op("Cast", [q], to=u8), one, em.op("Cast", [zq], to=u8)], "dq")
        y = em.op("MatMul", [xf, em.op("DequantizeLinear", [em.const(wq, "wq"), one], "dq")])
    else:
        y = em.op("MatMul", [em.op("Sub", [q, zq]), em.const(_wint(wq, zw), "wint")])
    return em.op("Mul", [y, em.op("Mul", [sx, em.const(sw.astype(F32), "sw")])], out=out)


def _wint(wq, zp) -> np.ndarray:
    return wq.astype(F32) - (np.zeros((), F32) if zp is None else zp.astype(F32))


def dynamic_quantize_matmul(node, em, shapes, consts, where):
    a_, b, bs, bz, bias = node_inputs(node, 5)
    bq, bsv, bzv = _const(node, consts, where, b, bs, bz)
    if bq.ndim != 2:
        fail(node, where, "B of rank other than 2 is not supported", "export the weight as a 2-D initializer")
    y = _dyn_matmul(em, a_, bq, bzv, bsv, None if bias else node.output[0])
    if bias:
        em.op("Add", [y, bias], out=node.output[0])


class _QuantLSTMEmitter(Emitter):
    """Runs rnn.decompose_lstm, replacing its MatMuls with the (dequantized) float weights Wt/Rt by
    dynamically quantized ones. Relies on rnn.py's const hints "Wt"/"Rt" (one each per direction, in
    order); dynamic_quantize_lstm checks that every one was replaced. For the layers the one-kernel recurrence
    does not take (`unrolled`): each step quantizes h, then runs an int8 MatMul."""

    unrolled = True

    def __init__(self, prefix, consts, quant):
        super().__init__(prefix, consts)
        self.quant, self.seen, self.names, self.used = quant, {"Wt": 0, "Rt": 0}, {}, set()

    def const(self, value, hint="c"):
        name = super().const(value, hint)
        if hint in self.seen:
            self.names[name] = self.quant[hint][self.seen[hint]]
            self.seen[hint] += 1
        return name

    def op(self, op_type, inputs, hint=None, out=None, **attrs):
        if op_type == "MatMul" and inputs[1] in self.names:
            self.used.add(inputs[1])
            return _dyn_matmul(self, inputs[0], *self.names[inputs[1]], out)
        return super().op(op_type, inputs, hint, out, **attrs)


# hidden sizes whose quantized recurrent products are exact in float32 (255 x 255 x H below 2^24) run as the
# one-kernel recurrence; wider ones (ddddocr's 512 units) keep their steps unrolled on the int8 matmul kernel, which
# reads a quarter of the float weights' bytes a step
ONE_KERNEL_HIDDEN = 256


def dynamic_quantize_lstm(node, em, shapes, consts, where):
    """LSTM with int8 W (dirs, input, 4H) and R (dirs, H, 4H), per-direction or per-column scales;
    the input projection quantizes X over all time steps at once, each step quantizes h, as
    onnxruntime's kernel does. Up to ONE_KERNEL_HIDDEN units the layer is one recurrence kernel (the
    projection on the int8 matmul kernel, every step's quantization of h and its product in the kernel:
    lstm_text_qdynamic's ~30 kernels a step made it 5x onnxruntime); wider or unusual layers (peepholes,
    clip, ...) are unrolled."""
    ins = node_inputs(node, 12)
    w, r, ws, wz, rs, rz = _const(node, consts, where, ins[1], ins[2], *ins[8:12])
    quant, floats = {}, []
    for key, q, s, z in (("Wt", w, ws, wz), ("Rt", r, rs, rz)):
        d = q.shape[0]
        s = np.broadcast_to(s.reshape(d, -1), (d, q.shape[2]))
        z = np.zeros_like(s) if z is None else np.broadcast_to(z.reshape(d, -1), (d, q.shape[2]))
        quant[key] = [(q[i], z[i], s[i]) for i in range(d)]
        floats.append(em.const(np.stack([(_wint(q[i], z[i]) * s[i]).T for i in range(d)]), key))
    lstm = onnx.helper.make_node("LSTM", [ins[0], *floats, *ins[3:8]], list(node.output), name=node.name)
    lstm.attribute.extend(node.attribute)
    if r.shape[1] <= ONE_KERNEL_HIDDEN and one_kernel(lstm, em, shapes, consts, _quantized_weights(quant)):
        return
    qem = _QuantLSTMEmitter(em.prefix + "/q", consts, quant)
    decompose_lstm(lstm, qem, shapes, consts, where)
    if len(qem.used) != 2 * w.shape[0] or qem.seen != {"Wt": w.shape[0], "Rt": w.shape[0]}:
        fail(
            node,
            where,
            "internal: rnn.decompose_lstm no longer emits its weight MatMuls as expected",
            "report this; the quantized LSTM rewrite must follow rnn.py",
        )
    em.nodes.extend(qem.nodes)


def _quantized_weights(quant: dict) -> QuantizedWeights:
    """The one-kernel recurrence's weights: the projection by every direction's W at once (x quantized over all
    steps and directions once: the same parameters as per direction), R as integer values and scales."""
    wq = np.concatenate([q for q, _, _ in quant["Wt"]], axis=1)
    wz = np.concatenate([z for _, z, _ in quant["Wt"]])
    ws = np.concatenate([s for _, _, s in quant["Wt"]])
    r_int = np.stack([_wint(q, z) for q, z, _ in quant["Rt"]])
    r_scale = np.stack([np.asarray(s, F32) for _, _, s in quant["Rt"]])
    return QuantizedWeights(lambda em, rows: _dyn_matmul(em, rows, wq, wz, ws), r_int, r_scale)


def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint8 (..., bytes) -> (..., count) values of `bits` bits each, low bits first."""
    per = 8 // bits
    shifts = (np.arange(per) * bits).astype(np.uint8)
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(*packed.shape[:-1], -1)[..., :count]


def matmul_nbits(node, em, shapes, consts, where):
    """A @ dequant(B).T + bias; B (N, k_blocks, blob) packed, scales (N, k_blocks), zero points packed
    uint8 or float, 2^(bits-1) without them; g_idx maps each k to its block (act-order)."""
    a = node_attrs(node)
    K, N, bits, bs = int(a["K"]), int(a["N"]), int(a.get("bits", 4)), int(a["block_size"])
    if bits not in (2, 4, 8):
        fail(node, where, f"bits={bits} is not supported", "quantize with 2, 4 or 8 bits")
    a_, b, sc, zp, gidx, bias = node_inputs(node, 6)
    bq, scv, zpv, gv = _const(node, consts, where, b, sc, zp, gidx)
    nb = (K + bs - 1) // bs
    q = _unpack(bq.reshape(N, nb, -1), bits, bs).reshape(N, nb * bs)[:, :K].astype(F32)
    scv = scv.astype(F32).reshape(N, nb)
    if zpv is None:
        zf = np.full((N, nb), 2 ** (bits - 1), F32)
    elif zpv.dtype == np.uint8:
        zf = _unpack(zpv.reshape(N, -1), bits, nb).astype(F32)
    else:
        zf = zpv.astype(F32).reshape(N, nb)
    block = gv.astype(np.int64).reshape(K) if gv is not None else np.arange(K) // bs
    wf = (q - zf[:, block]) * scv[:, block]  # (N, K)
    y = em.op("MatMul", [a_, em.const(np.ascontiguousarray(wf.T), "w")], out=None if bias else node.output[0])
    if bias:
        em.op("Add", [y, bias], out=node.output[0])


REWRITES = {
    "QLinearSigmoid": _unary("Sigmoid"),
    "QLinearLeakyRelu": _unary("LeakyRelu"),
    "QLinearConcat": qlinear_concat,
    "QLinearAveragePool": qlinear_average_pool,
    "QGemm": qgemm,
    "MatMulIntegerToFloat": matmul_integer_to_float,
    "DynamicQuantizeMatMul": dynamic_quantize_matmul,
    "DynamicQuantizeLSTM": dynamic_quantize_lstm,
    "MatMulNBits": matmul_nbits,
}
