"""The LLM-era standard ops of opsets 24-27 that TVM 0.27's importer lacks, rewritten into ops it converts,
with the semantics of ONNX's reference implementations (onnx/reference/ops/op_*.py).

LinearAttention's ONNX function body is a Scan, which TVM cannot import; with the sequence length static
(shapes are pinned) the recurrence is unrolled here, one step per position, in float32 as the reference
accumulates. TensorScatter (a KV-cache write at per-batch offsets that are data) becomes a gather of the
update at each cache position plus a Where that keeps the old cache where nothing is written.
CausalConvWithState (ONNX's body inlines fine in general) is written out for its k = 1 and fp16 SiLU cases.
BitCast (opset 26) is in bitcast.py.

The rewrite interface passes no element types: LinearAttention carries them with CastLike (to the query, the
past state); CausalConvWithState and BitCast read them from the model (llm_common.elem_type)."""

from __future__ import annotations

import math

import numpy as np

from ...errors import UnsupportedModelError
from .bitcast import bitcast
from .emitter import Emitter
from .llm_common import elem_type
from .quant import node_attrs, node_inputs

F32, I64 = np.float32, np.int64
FLOAT, FLOAT16, BFLOAT16 = 1, 10, 16  # TensorProto element types
MAX_UNROLL = 512  # LinearAttention steps unrolled at most (about 15 nodes each)


def _fail(node, where, msg, fix):
    raise UnsupportedModelError(f"{node.op_type}: {msg}", where=f"{where}: node {node.name!r}", fix=fix)


def _shape(node, shapes, name, where, rank=None):
    s = shapes.get(name)
    if s is None or (rank is not None and len(s) != rank):
        _fail(
            node,
            where,
            f"input {name!r} needs a static shape{f' of rank {rank}' if rank else ''} (got {s})",
            "pin the input shapes (--input-shape) so the sequence length is known",
        )
    return tuple(int(d) for d in s)


def _heads_first(em: Emitter, x: str, b: int, t: int, h: int, d: int) -> str:
    """(B, T, H*D) -> (B, H, T, D), as float32."""
    x4 = em.op("Transpose", [em.reshape(x, [b, t, h, d])], perm=[0, 2, 1, 3])
    return em.op("Cast", [x4], to=FLOAT)


# ------------------------------------------------------------------------------------------ LinearAttention


def linear_attention(node, em: Emitter, shapes, consts, where):
    """state S (B, Hkv, dk, dv) per step t: S *= exp(g_t) (gated); v_t = beta_t (v_t - S^T k_t) (delta);
    S += k_t v_t^T; o_t = scale q_t S with query head h reading kv head h // (Hq / Hkv)."""
    a = node_attrs(node)
    q, k, v, past, decay, beta = node_inputs(node, 6)
    rule = a.get("update_rule", b"gated_delta")
    rule = rule.decode() if isinstance(rule, bytes) else rule
    hq, hkv = a.get("q_num_heads"), a.get("kv_num_heads")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        _fail(node, where, f"unknown update_rule {rule!r}", "use linear, gated, delta or gated_delta")
    if not hq or not hkv or hq % hkv:
        _fail(
            node,
            where,
            f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}",
            "set both attributes as the spec requires",
        )
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != bool(decay) or delta != bool(beta):
        _fail(
            node,
            where,
            f"update_rule {rule!r} with decay {'given' if decay else 'absent'} and beta "
            f"{'given' if beta else 'absent'}",
            "gated rules need decay, delta rules need beta",
        )
    b, t, qd = _shape(node, shapes, q, where, 3)
    _shape(node, shapes, k, where, 3)  # checks k is rank 3; its last dim is not needed
    vd = _shape(node, shapes, v, where, 3)[2]
    dk, dv, g = qd // hq, vd // hkv, hq // hkv
    if t > MAX_UNROLL:
        _fail(
            node,
            where,
            f"sequence length {t} is over the {MAX_UNROLL} steps Kiln unrolls",
            "run the prefill in chunks of at most that many positions, carrying present_state",
        )
    scale = a.get("scale") or 1.0 / math.sqrt(dk)
    q4, k4 = _heads_first(em, q, b, t, hq, dk), _heads_first(em, k, b, t, hkv, dk)
    v4 = _heads_first(em, v, b, t, hkv, dv)
    if gating:
        dl = _shape(node, shapes, decay, where, 3)[2]
        if dl not in (hkv, hkv * dk):
            _fail(node, where, f"decay's last dim {dl} is neither kv_num_heads nor kv_num_heads*d_k", "fix decay")
        # exp(g) transposed to (B, Hkv, dk|1, T): step t's column multiplies S's rows
        ge = em.op("Exp", [_heads_first(em, decay, b, t, hkv, dl // hkv)])
        ge = em.op("Transpose", [ge], perm=[0, 1, 3, 2])
    if delta:
        bl = _shape(node, shapes, beta, where, 3)[2]
        if bl not in (hkv, 1):
            _fail(node, where, f"beta's last dim {bl} is neither kv_num_heads nor 1", "fix beta")
        be = _heads_first(em, beta, b, t, bl, 1)  # (B, Hkv|1, T, 1)
    if past:
        state = em.op("Cast", [past], to=FLOAT)
    else:
        state = em.const(np.zeros((b, hkv, dk, dv), F32), "state0")
    kt4 = em.op("Transpose", [k4], perm=[0, 1, 3, 2])  # (B, Hkv, dk, T)
    outs = []
    for i in range(t):
        k_t, kcol = em.slice(k4, i, i + 1, 2), em.slice(kt4, i, i + 1, 3)  # (B,Hkv,1,dk), (B,Hkv,dk,1)
        v_t = em.slice(v4, i, i + 1, 2)  # (B, Hkv, 1, dv)
        if gating:
            state = em.op("Mul", [state, em.slice(ge, i, i + 1, 3)])
        if delta:
            retrieved = em.op("MatMul", [k_t, state])  # (B, Hkv, 1, dv)
            v_t = em.op("Mul", [em.slice(be, i, i + 1, 2), em.op("Sub", [v_t, retrieved])])
        state = em.op("Add", [state, em.op("Mul", [kcol, v_t])])
        q_t = em.reshape(em.slice(q4, i, i + 1, 2), [b, hkv, g, dk])  # query heads grouped by kv head
        o_t = em.op("MatMul", [q_t, state])  # (B, Hkv, G, dv)
        outs.append(em.reshape(em.op("Mul", [o_t, em.const(F32(scale), "scale")]), [b, 1, hq * dv]))
    out = em.op("Concat", outs, axis=1) if len(outs) > 1 else outs[0]
    em.op("CastLike", [out, q], out=node.output[0])
    if len(node.output) > 1 and node.output[1]:
        em.op("CastLike", [state, past or q], out=node.output[1])


# ------------------------------------------------------------------------------------------ TensorScatter


def tensor_scatter(node, em: Emitter, shapes, consts, where):
    """present[pre, p, ...] = update[pre, p - w[pre[0]], ...] where 0 <= p - w < S_upd (mod L in circular
    mode), past_cache elsewhere: a GatherElements of the update at every cache position, then a Where."""
    a = node_attrs(node)
    cache, upd, widx = node_inputs(node, 3)
    mode = a.get("mode", b"linear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("linear", "circular"):
        _fail(node, where, f"unknown mode {mode!r}", "use linear or circular")
    cs, us = _shape(node, shapes, cache, where), _shape(node, shapes, upd, where, len(shapes.get(cache, ())))
    r = len(cs)
    axis = a.get("axis", -2) % r
    if axis == 0:
        _fail(node, where, "axis 0 (the batch axis that write_indices index)", "scatter along a later axis")
    big, su = cs[axis], us[axis]
    pos = em.const(np.arange(big, dtype=I64).reshape([1] * axis + [big] + [1] * (r - axis - 1)), "pos")
    if widx:
        w = em.reshape(em.op("Cast", [widx], to=7), [cs[0]] + [1] * (r - 1))
        d = em.op("Sub", [pos, w])
    else:
        d = pos
    if mode == "circular":
        d = em.op("Mod", [em.op("Add", [d, em.const(I64(big), "len")]), em.const(I64(big), "len")])
    lo, hi = em.const(I64(0), "zero"), em.const(I64(su - 1), "last")
    valid = em.op("And", [em.op("GreaterOrEqual", [d, lo]), em.op("LessOrEqual", [d, hi])])
    idx_shape = em.const(np.array(cs[:axis] + (big,) + cs[axis + 1 :], I64), "shape")
    idx = em.op("Expand", [em.op("Min", [em.op("Max", [d, lo]), hi]), idx_shape])
    gathered = em.op("GatherElements", [upd, idx], axis=axis)
    em.op("Where", [em.op("Expand", [valid, idx_shape]), gathered, cache], out=node.output[0])


# ------------------------------------------------------------------------------------------ CausalConvWithState


def causal_conv_with_state(node, em: Emitter, shapes, consts, where):
    """padded = [past_state or zeros, input] along time; output = depthwise valid Conv1d(padded), then SiLU;
    present_state = the last k-1 columns of padded. fp16/bf16 are computed as the reference does: the conv
    in float32 rounded to the input's type, the SiLU in float32. Written out rather than inlined from
    ONNX's body: with k = 1 the body's zero-size constant pad cannot be loaded back from TVM's executable,
    and the body's fp16 conv and SiLU round off by 2-3 ulps."""
    a = node_attrs(node)
    x, w, bias, past = node_inputs(node, 4)
    act = a.get("activation", b"none")
    act = act.decode() if isinstance(act, bytes) else act
    if act not in ("none", "silu", "swish"):
        _fail(node, where, f"unknown activation {act!r}", "use none, silu or swish")
    bsz, ch, length = _shape(node, shapes, x, where, 3)
    k = _shape(node, shapes, w, where, 3)[2]
    if k > 1:
        pad = past or em.op("CastLike", [em.const(np.zeros((bsz, ch, k - 1), F32), "pad"), x])
        padded = em.op("Concat", [pad, x], axis=2)
    else:
        padded = x
    low = elem_type(x) in (FLOAT16, BFLOAT16)  # the reference accumulates them in float32
    ins = [padded, w] + ([bias] if bias else [])
    conv = em.op(
        "Conv",
        [em.op("Cast", [i], to=FLOAT) for i in ins] if low else ins,
        group=ch,
        kernel_shape=[k],
        pads=[0, 0],
        strides=[1],
        dilations=[1],
    )
    if low:
        conv = em.op("CastLike", [conv, x])  # rounded to the input's type, as the reference does
    if act == "none":
        em.op("Identity", [conv], out=node.output[0])
    else:
        cf = em.op("Cast", [conv], to=FLOAT) if low else conv
        em.op("CastLike", [em.op("Mul", [cf, em.op("Sigmoid", [cf])]), x], out=node.output[0])
    if len(node.output) > 1 and node.output[1]:
        total = length + k - 1
        em.op(
            "Slice",
            [padded] + [em.const(np.array([v], I64), "s") for v in (total - (k - 1), total, 2)],
            out=node.output[1],
        )


REWRITES = {
    "LinearAttention": linear_attention,
    "TensorScatter": tensor_scatter,
    "CausalConvWithState": causal_conv_with_state,
    "BitCast": bitcast,
}
