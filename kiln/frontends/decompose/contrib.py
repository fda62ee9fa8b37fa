"""onnxruntime's float contrib ops (domain com.microsoft), as written by its graph optimizer and its
transformer optimizer (onnxruntime.transformers.optimizer), rewritten into standard ONNX ops with the
semantics of onnxruntime's CPU kernels (docs/ContribOperators.md).

TVM 0.27 converts Attention, SkipLayerNormalization and EmbedLayerNormalization itself, but only in
part: its Attention asserts on past/present, unidirectional and a custom scale and gets a 1-D mask
wrong, its SkipLayerNormalization requires beta and bias, its EmbedLayerNormalization drops
embedding_sum. So Kiln rewrites all of them here, Gelu/FastGelu/BiasGelu too (one path for the family).

Shapes of tensors downstream of a contrib op are unknown to ONNX shape inference, so these rewrites
need no static shapes: Reshape with 0/-1, masks built from CumSum of ones, means as a MatMul with a
constant column (ReduceMean's axes moved from attribute to input in opset 18; this is opset-stable)."""

from __future__ import annotations

import math

import numpy as np

from .contrib_common import F32, cumsum, fail, ones_like
from .emitter import Emitter
from .quant import node_attrs, node_inputs


def _gelu(em: Emitter, x: str, out: str) -> str:
    """0.5 x (1 + erf(x / sqrt 2))"""
    e = em.op("Erf", [em.op("Mul", [x, em.const(F32(1 / math.sqrt(2)))])])
    return em.op("Mul", [em.op("Mul", [x, em.const(F32(0.5))]), em.op("Add", [e, em.const(F32(1))])], out=out)


def _tanh_gelu(em: Emitter, x: str, out: str) -> str:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"""
    x3 = em.op("Mul", [em.op("Mul", [x, x]), x])
    inner = em.op(
        "Mul", [em.op("Add", [x, em.op("Mul", [x3, em.const(F32(0.044715))])]), em.const(F32(math.sqrt(2 / math.pi)))]
    )
    t = em.op("Add", [em.op("Tanh", [inner]), em.const(F32(1))])
    return em.op("Mul", [em.op("Mul", [x, em.const(F32(0.5))]), t], out=out)


def gelu(node, em, shapes, consts, where):
    _gelu(em, node.input[0], node.output[0])


def bias_gelu(node, em, shapes, consts, where):
    _gelu(em, em.op("Add", list(node.input[:2])), node.output[0])


def fast_gelu(node, em, shapes, consts, where):
    x, b = node_inputs(node, 2)
    _tanh_gelu(em, em.op("Add", [x, b]) if b else x, node.output[0])


def quick_gelu(node, em, shapes, consts, where):
    """x * sigmoid(alpha x), alpha 1.702 by default."""
    x = node.input[0]
    s = em.op("Sigmoid", [em.op("Mul", [x, em.const(F32(node_attrs(node).get("alpha", 1.702)))])])
    em.op("Mul", [x, s], out=node.output[0])


def bias_add(node, em, shapes, consts, where):
    x, b, skip = node.input[:3]
    em.op("Add", [em.op("Add", [x, b]), skip], out=node.output[0])


def _activation(em: Emitter, name: str, params: list, x: str, out: str) -> str:
    c = lambda v: em.const(F32(v))
    if name in ("Relu", "Tanh", "Sigmoid"):
        return em.op(name, [x], out=out)
    if name == "LeakyRelu":
        return em.op("LeakyRelu", [x], out=out, alpha=float(params[0]) if params else 0.01)
    if name == "Clip":  # Max/Min: Clip's bounds moved from attributes to inputs in opset 11
        lo, hi = (params + [-np.inf, np.inf])[:2] if params else (-np.inf, np.inf)
        return em.op("Min", [em.op("Max", [x, c(lo)]), c(hi)], out=out)
    if name == "HardSigmoid":
        alpha, beta = (list(params) + [0.2, 0.5][len(params) :])[:2]
        return em.op("HardSigmoid", [x], out=out, alpha=float(alpha), beta=float(beta))
    return None


def fused_conv(node, em, shapes, consts, where):
    """Conv (+ Z, the residual input 3) -> activation, the graph optimizer's Conv+activation fusion."""
    a = node_attrs(node)
    act = a.pop("activation", b"")
    act = act.decode() if isinstance(act, bytes) else act
    params = list(a.pop("activation_params", []))
    x, w, b, z = node_inputs(node, 4)
    y = em.op("Conv", [x, w, b] if b else [x, w], "conv", **a)
    if z:
        y = em.op("Add", [y, z])
    if not act:
        em.op("Identity", [y], out=node.output[0])
    elif _activation(em, act, params, y, node.output[0]) is None:
        fail(
            node,
            where,
            f"activation {act!r} is not supported",
            "use Relu, Tanh, Sigmoid, LeakyRelu, Clip or HardSigmoid",
        )


def _rank(name, shapes, consts):
    if name in shapes:
        return len(shapes[name])
    return np.asarray(consts[name]).ndim if name in consts else None


def _swap_last(em: Emitter, x: str, rank: int) -> str:
    return em.op("Transpose", [x], perm=list(range(rank - 2)) + [rank - 1, rank - 2])


def fused_matmul(node, em, shapes, consts, where):
    """alpha * op(A) @ op(B), op a transpose of the last two axes (transA/transB)."""
    a = node_attrs(node)
    if a.get("transBatchA", 0) or a.get("transBatchB", 0):
        fail(node, where, "transBatchA/transBatchB are not supported", "export the MatMul without batch transposes")
    ins = list(node.input[:2])
    for i, key in enumerate(("transA", "transB")):
        if a.get(key, 0):
            r = _rank(ins[i], shapes, consts)
            if r is None:  # downstream of another contrib op: no static rank, so an ellipsis
                ins[i] = em.op("Einsum", [ins[i]], equation="...ij->...ji")
            elif r >= 2:
                ins[i] = _swap_last(em, ins[i], r)
    alpha = float(a.get("alpha", 1.0))
    y = em.op("MatMul", ins, out=None if alpha != 1.0 else node.output[0])
    if alpha != 1.0:
        em.op("Mul", [y, em.const(F32(alpha))], out=node.output[0])


def _row_mean(em: Emitter, x: str, width: int) -> str:
    """Mean over the last axis, keepdims, as x @ ones(width, 1) / width (no ReduceMean: opset-stable)."""
    return em.op("MatMul", [x, em.const(np.full((width, 1), 1.0 / width, F32), "mean")])


def _width(node, gamma, consts, shapes, where) -> int:
    if gamma in consts:
        return int(np.asarray(consts[gamma]).shape[-1])
    if gamma in shapes:
        return int(shapes[gamma][-1])
    fail(node, where, "gamma has no static shape", "export the model with gamma as an initializer")


def _no_stats(node, where, idx=(1, 2)):
    outs = list(node.output)
    if any(i < len(outs) and outs[i] for i in idx):
        fail(
            node,
            where,
            "the mean and inv_std_var outputs are not supported (training outputs)",
            "export the model for inference",
        )


def _rms(em: Emitter, x: str, gamma: str, eps: float, width: int, out: str) -> str:
    ms = _row_mean(em, em.op("Mul", [x, x]), width)
    inv = em.op("Reciprocal", [em.op("Sqrt", [em.op("Add", [ms, em.const(F32(eps))])])])
    return em.op("Mul", [em.op("Mul", [x, inv]), gamma], out=out)


def _skip_sum(node, em, x, skip, bias):
    s = em.op("Add", [x, skip])
    out3 = node.output[3] if len(node.output) > 3 and node.output[3] else None
    return em.op("Add", [s, bias], out=out3) if bias else (em.op("Identity", [s], out=out3) if out3 else s)


def skip_layer_norm(node, em, shapes, consts, where):
    """LayerNorm(input + skip + bias) * gamma + beta; output 3 is the sum before normalization."""
    _no_stats(node, where)
    x, skip, gamma, beta, bias = node_inputs(node, 5)
    s = _skip_sum(node, em, x, skip, bias)
    eps = float(node_attrs(node).get("epsilon", 1e-12))
    em.op("LayerNormalization", [s, gamma, beta] if beta else [s, gamma], out=node.output[0], axis=-1, epsilon=eps)


def skip_simplified_layer_norm(node, em, shapes, consts, where):
    """RMSNorm(input + skip + bias) * gamma; output 3 is the sum before normalization."""
    _no_stats(node, where)
    x, skip, gamma, bias = node_inputs(node, 4)
    s = _skip_sum(node, em, x, skip, bias)
    eps = float(node_attrs(node).get("epsilon", 1e-12))
    _rms(em, s, gamma, eps, _width(node, gamma, consts, shapes, where), node.output[0])


def simplified_layer_norm(node, em, shapes, consts, where):
    """x / sqrt(mean(x^2) + epsilon) * scale over the last axis (RMSNorm, T5/Llama)."""
    _no_stats(node, where)
    a = node_attrs(node)
    x, gamma = node.input[:2]
    r = _rank(x, shapes, consts)
    if a.get("axis", -1) not in (-1, (r - 1) if r else -1):
        fail(node, where, "normalization over more than the last axis is not supported", "normalize the last axis")
    _rms(em, x, gamma, float(a.get("epsilon", 1e-5)), _width(node, gamma, consts, shapes, where), node.output[0])


def embed_layer_norm(node, em, shapes, consts, where):
    """LayerNorm(word[ids] + position[pos] + segment[seg]); mask_index = sum of mask per row (int32)."""
    ids, seg, word, pos, segemb, gamma, beta, mask, pos_ids = node_inputs(node, 9)
    outs = list(node.output) + ["", ""]
    eps = float(node_attrs(node).get("epsilon", 1e-12))
    s = em.op("Gather", [word, ids], axis=0)
    if not pos_ids:
        if ids in shapes:
            pos_ids = em.const(np.arange(shapes[ids][1], dtype=np.int64)[None], "pos")
        else:  # 0..S-1 from a running sum of ones
            ones = ones_like(em, em.op("Cast", [ids], to=1))
            pos_ids = em.op("Cast", [em.op("Sub", [cumsum(em, ones, 1), em.const(F32(1))])], to=7)
    s = em.op("Add", [s, em.op("Gather", [pos, pos_ids], axis=0)])
    if seg:
        s = em.op("Add", [s, em.op("Gather", [segemb, seg], axis=0)])
    if outs[2]:
        s = em.op("Identity", [s], out=outs[2])
    em.op("LayerNormalization", [s, gamma, beta], out=outs[0], axis=-1, epsilon=eps)
    if outs[1]:
        if ids in shapes:  # for Attention downstream, which ONNX shape inference cannot reach
            shapes[outs[1]] = (shapes[ids][0],)
        if mask:
            last = em.const(np.int64(-1), "last")
            em.op(
                "Cast",
                [em.op("Gather", [cumsum(em, em.op("Cast", [mask], to=6), 1), last], axis=1)],
                out=outs[1],
                to=6,
            )
        else:
            em.op(
                "Mul",
                [em.op("Gather", [ids, em.const(np.int64(0), "first")], axis=1), em.const(np.int32(0))],
                out=outs[1],
            )


from .contrib_attention import attention  # noqa: E402  (kept apart: the file grew past 300 lines)

REWRITES = {
    "Gelu": gelu,
    "BiasGelu": bias_gelu,
    "FastGelu": fast_gelu,
    "QuickGelu": quick_gelu,
    "BiasAdd": bias_add,
    "FusedConv": fused_conv,
    "FusedMatMul": fused_matmul,
    "SkipLayerNormalization": skip_layer_norm,
    "SkipSimplifiedLayerNormalization": skip_simplified_layer_norm,
    "SimplifiedLayerNormalization": simplified_layer_norm,
    "EmbedLayerNormalization": embed_layer_norm,
    "Attention": attention,
}
# onnxruntime registers SimplifiedLayerNormalization in the default ONNX domain too
DEFAULT_DOMAIN_REWRITES = {"SimplifiedLayerNormalization": simplified_layer_norm}
