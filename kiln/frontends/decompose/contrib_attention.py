"""onnxruntime's com.microsoft Attention (the BERT/GPT-2 fusion of onnxruntime.transformers.optimizer)
as MatMul/Softmax, with the CPU kernel's semantics: packed QKV projection (qkv_hidden_sizes),
scale (1/sqrt(head_size) by default), mask_index as 1-D end positions, 2-D (batch, total_seq) or
3-D (batch, seq, total_seq) key masks (masked scores get mask_filter_value, -10000 by default),
unidirectional (causal), past/present key-value caches (2, batch, heads, seq, head_size) and the
additive attention_bias. Needs no static shapes: scores are laid out (heads, batch, seq, total_seq) so
that 2-D/3-D masks broadcast without Unsqueeze, and positions come from CumSum of ones."""

from __future__ import annotations

import math

import numpy as np

from .contrib_common import F32, cumsum, fail, ones_like
from .emitter import Emitter
from .quant import node_attrs, node_inputs


def _heads(em: Emitter, x: str, n: int, size: int) -> str:
    """(B, S, n*size) -> (n, B, S, size)"""
    return em.op("Transpose", [em.reshape(x, [0, 0, n, size])], perm=[2, 0, 1, 3])


def _key_mask(em: Emitter, mask: str, rank: int, scores: str, filt: str) -> str:
    """Additive mask broadcastable to scores (N, B, S, T)."""
    zero = em.const(F32(0))
    if rank in (2, 3):
        keep = em.op("Greater", [em.op("Cast", [mask], to=1), zero])
        add = em.op("Where", [keep, zero, filt])
        return em.reshape(add, [0, 1, -1]) if rank == 2 else add
    # 1-D: keys at or past end[b] (and, for 2*B entries, before start[b]) are masked
    col = cumsum(em, ones_like(em, em.take(scores, 0)), 3)  # (1, B, S, T): 1..T along the keys
    mf = em.op("Cast", [mask], to=1)
    end = mf
    if rank == -2:  # 2*B entries: the ends, then the starts
        b = em.op("Gather", [em.reshape(scores, [0, 0, -1]), em.const(np.int64(0), "i0")], axis=2)  # (N, B)
        nb = em.op("Shape", [em.take(b, 0)])  # [B]
        end = em.op("Slice", [mf, em.const(np.array([0], np.int64)), nb, em.const(np.array([0], np.int64))])
    masked = em.op("Greater", [col, em.reshape(end, [1, -1, 1, 1])])
    if rank == -2:
        start = em.op("Slice", [mf, nb, em.const(np.array([2**62], np.int64)), em.const(np.array([0], np.int64))])
        early = em.op("Not", [em.op("Greater", [col, em.reshape(start, [1, -1, 1, 1])])])
        masked = em.op("Or", [masked, early])
    return em.op("Where", [masked, filt, zero])


def _causal(em: Emitter, scores: str, filt: str) -> str:
    """mask_filter_value where key j > query i + past, i.e. (j+1) - (i+1) > T - S."""
    ones = ones_like(em, em.take(em.take(scores, 0), 0, axis=1))  # (1, 1, S, T)
    cj, ri = cumsum(em, ones, 3), cumsum(em, ones, 2)
    t = em.op("Gather", [cj, em.const(np.int64(-1), "last")], axis=3)  # (1, 1, S): T
    s = em.op("Gather", [ri, em.const(np.int64(-1), "last")], axis=2)  # (1, 1, T): S
    lhs = em.op("Sub", [em.op("Sub", [cj, ri]), em.reshape(t, [1, 1, -1, 1])])
    masked = em.op("Greater", [em.op("Add", [lhs, em.reshape(s, [1, 1, 1, -1])]), em.const(F32(0))])
    return em.op("Where", [masked, filt, em.const(F32(0))])


def attention(node, em, shapes, consts, where):
    x, w, bias, mask, past, attn_bias, past_len = node_inputs(node, 7)
    a = node_attrs(node)
    for key in ("do_rotary", "past_present_share_buffer"):
        if a.get(key, 0):
            fail(node, where, f"{key} is not supported", "export attention without it")
    if past_len:
        fail(node, where, "past_sequence_length is not supported", "export without a shared KV buffer")
    n = int(a["num_heads"])
    if "qkv_hidden_sizes" in a:
        dq, dk, dv = (int(v) for v in a["qkv_hidden_sizes"])
    elif w in consts:
        dq = dk = dv = int(consts[w].shape[1]) // 3
    elif bias in consts:
        dq = dk = dv = int(consts[bias].shape[0]) // 3
    else:
        fail(node, where, "weights of unknown width", "export the model with its weights as initializers")
    hq, hv = dq // n, dv // n
    filt = em.const(F32(a.get("mask_filter_value", -10000.0)), "filter")
    qkv = em.op("MatMul", [x, w])
    if bias:
        qkv = em.op("Add", [qkv, bias])
    q = _heads(em, em.slice(qkv, 0, dq, 2), n, hq)
    outs = list(node.output) + [""]
    if past or outs[1]:
        if dk != dv:
            fail(node, where, "past/present with different K and V widths", "use equal K and V hidden sizes")
        kv = em.op(
            "Transpose", [em.reshape(em.slice(qkv, dq, dq + 2 * dk, 2), [0, 0, 2, n, hq])], perm=[2, 0, 3, 1, 4]
        )  # (2, B, N, S, h)
        if past:
            kv = em.op("Concat", [past, kv], axis=3)
        if outs[1]:
            kv = em.op("Identity", [kv], out=outs[1])
        pick = lambda i: em.op(
            "Transpose",
            [em.op("Gather", [kv, em.const(np.int64(i), "i")], axis=0)],
            perm=[1, 0, 2, 3],
        )  # (N, B, T, h)
        k, v = pick(0), pick(1)
    else:
        k = _heads(em, em.slice(qkv, dq, dq + dk, 2), n, hq)
        v = _heads(em, em.slice(qkv, dq + dk, dq + dk + dv, 2), n, hv)
    scale = float(a.get("scale", 0.0)) or 1.0 / math.sqrt(hq)
    scores = em.op("Mul", [em.op("MatMul", [q, em.op("Transpose", [k], perm=[0, 1, 3, 2])]), em.const(F32(scale))])
    add = []
    if attn_bias:
        add.append(em.op("Transpose", [attn_bias], perm=[1, 0, 2, 3]))
    if mask:
        rank = len(shapes[mask]) if mask in shapes else None
        if rank == 1 and mask in shapes and x in shapes and shapes[mask][0] == 2 * shapes[x][0]:
            rank = -2
        if rank not in (1, -2, 2, 3):
            fail(node, where, f"mask_index of rank {rank} is not supported", "use a 1-D, 2-D or 3-D mask_index")
        add.append(_key_mask(em, mask, rank, scores, filt))
    if a.get("unidirectional", 0):
        add.append(_causal(em, scores, filt))
    for m in add:
        scores = em.op("Add", [scores, m])
    probs = em.op("Softmax", [scores], axis=-1)
    y = em.op("Transpose", [em.op("MatMul", [probs, v])], perm=[1, 2, 0, 3])  # (B, S, N, hv)
    em.op("Reshape", [y, em.const(np.array([0, 0, -1], np.int64), "shape")], out=outs[0])
