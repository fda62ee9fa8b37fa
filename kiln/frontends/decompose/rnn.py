"""LSTM and GRU as unrolled primitive ONNX ops (shapes are pinned, so the sequence length is
static): one MatMul for the input projection of all time steps, then per step one MatMul with the
recurrent weights, gate slices and elementwise math, exactly as the ONNX spec defines them."""
from __future__ import annotations

import numpy as np
import onnx

from ...errors import UnsupportedModelError
from .emitter import Emitter

ACTIVATIONS = {"Sigmoid": "Sigmoid", "Tanh": "Tanh", "Relu": "Relu"}


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _setup(node, em: Emitter, shapes, consts, where, gates: int, default_acts: list[str]):
    a = _attrs(node)
    ins = list(node.input) + [""] * (8 - len(node.input))
    direction = a.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    ndir = 2 if direction == "bidirectional" else 1
    acts = [x.decode() if isinstance(x, bytes) else x for x in a.get("activations", default_acts * ndir)]
    bad = [x for x in acts if x not in ACTIVATIONS]
    where_n = f"{where}: node {node.name!r}"
    if bad:
        raise UnsupportedModelError(f"{node.op_type} activations {bad} are not supported", where=where_n,
                                    fix=f"use {sorted(ACTIVATIONS)}")
    for i, what in ((1, "W"), (2, "R")):
        if ins[i] not in consts:
            raise UnsupportedModelError(f"{node.op_type} with non-constant {what} is not supported", where=where_n,
                                        fix="export the model with its weights as initializers")
    x = ins[0]
    if x not in shapes:
        raise UnsupportedModelError(f"{node.op_type} input {x!r} has no static shape", where=where_n,
                                    fix="pin every input with --input-shape")
    if ins[4] and not (ins[4] in consts and np.all(consts[ins[4]] == shapes[x][1 - a.get("layout", 0)])):
        raise UnsupportedModelError(f"{node.op_type} with variable sequence_lens is not supported", where=where_n,
                                    fix="pad sequences to one length and drop sequence_lens")
    if a.get("layout", 0) == 1:
        x = em.op("Transpose", [x], perm=[1, 0, 2])
        T, B, _ = (shapes[ins[0]][1], shapes[ins[0]][0], shapes[ins[0]][2])
    else:
        T, B, _ = shapes[ins[0]]
    H = a["hidden_size"]
    W, R = consts[ins[1]], consts[ins[2]]
    Bias = consts[ins[3]] if ins[3] in consts else np.zeros((ndir, 2 * gates * H), W.dtype)
    if ins[3] and ins[3] not in consts:
        raise UnsupportedModelError(f"{node.op_type} with non-constant B is not supported", where=where_n,
                                    fix="export the model with its recurrent bias as an initializer (constant)")
    return a, ins, x, ndir, direction, acts, T, B, H, W, R, Bias


def _initial(em: Emitter, ins, idx, d, B, H, dtype, layout: int) -> str:
    """Initial state of direction d: [dirs, B, H] (layout 0) or [B, dirs, H] (layout 1)."""
    if ins[idx]:
        return em.reshape(em.take(ins[idx], d, axis=1 if layout else 0), [B, H])
    return em.const(np.zeros((B, H), dtype), "zeros")


def _act(em: Emitter, name: str, x: str, clip) -> str:
    if clip is not None:
        x = em.op("Clip", [x, em.const(np.float32(-clip)), em.const(np.float32(clip))])
    return em.op(ACTIVATIONS[name], [x])


def _steps(direction: str, d: int, T: int):
    reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
    return list(range(T - 1, -1, -1)) if reverse else list(range(T))


def _finish(node, em: Emitter, a, per_dir, T, B, H, ndir):
    """per_dir: list of (ys by time index, h_last, c_last or None). Emits Y, Y_h, Y_c."""
    layout = a.get("layout", 0)
    outs = list(node.output) + [""] * 3
    Ys, Hs, Cs = [], [], []
    for ys, h, c in per_dir:
        Ys.append(em.reshape(em.op("Concat", ys, axis=0), [T, 1, B, H]))
        Hs.append(em.reshape(h, [1, B, H]))
        if c is not None:
            Cs.append(em.reshape(c, [1, B, H]))
    for name, parts, perm in ((outs[0], Ys, [2, 0, 1, 3]), (outs[1], Hs, [1, 0, 2]), (outs[2], Cs, [1, 0, 2])):
        if not name or not parts:
            continue
        axis = 1 if parts is Ys else 0
        if layout == 1:
            cat = em.op("Concat", parts, axis=axis)
            em.op("Transpose", [cat], out=name, perm=perm)
        else:
            em.op("Concat", parts, out=name, axis=axis)


def decompose_lstm(node, em: Emitter, shapes, consts, where) -> None:
    a, ins, x, ndir, direction, acts, T, B, H, W, R, Bias = _setup(node, em, shapes, consts, where, 4, ["Sigmoid", "Tanh", "Tanh"])
    clip, input_forget = a.get("clip"), a.get("input_forget", 0)
    P = consts.get(ins[7]) if ins[7] else None
    per_dir = []
    for d in range(ndir):
        f, g, hact = acts[3 * d: 3 * d + 3]
        xw = em.op("Add", [em.op("MatMul", [x, em.const(W[d].T.copy(), "Wt")]), em.const(Bias[d][:4 * H] + Bias[d][4 * H:], "b")])
        rt = em.const(R[d].T.copy(), "Rt")
        layout = a.get("layout", 0)
        h, c = _initial(em, ins, 5, d, B, H, W.dtype, layout), _initial(em, ins, 6, d, B, H, W.dtype, layout)
        ys = {}
        for t in _steps(direction, d, T):
            gates = em.op("Add", [em.reshape(em.take(xw, t), [B, 4 * H]), em.op("MatMul", [h, rt])])
            gi, go, gf, gc = (em.slice(gates, k * H, (k + 1) * H, 1) for k in range(4))
            if P is not None:
                gi = em.op("Add", [gi, em.op("Mul", [c, em.const(P[d][:H])])])
                gf = em.op("Add", [gf, em.op("Mul", [c, em.const(P[d][2 * H:])])])
            i = _act(em, f, gi, clip)
            fg = em.op("Sub", [em.const(np.ones((), W.dtype)), i]) if input_forget else _act(em, f, gf, clip)
            c = em.op("Add", [em.op("Mul", [fg, c]), em.op("Mul", [i, _act(em, g, gc, clip)])])
            if P is not None:
                go = em.op("Add", [go, em.op("Mul", [c, em.const(P[d][H:2 * H])])])
            h = em.op("Mul", [_act(em, f, go, clip), em.op(ACTIVATIONS[hact], [c])])
            ys[t] = h
        per_dir.append(([ys[t] for t in range(T)], h, c))
    _finish(node, em, a, per_dir, T, B, H, ndir)


def decompose_gru(node, em: Emitter, shapes, consts, where) -> None:
    a, ins, x, ndir, direction, acts, T, B, H, W, R, Bias = _setup(node, em, shapes, consts, where, 3, ["Sigmoid", "Tanh"])
    clip, lbr = a.get("clip"), a.get("linear_before_reset", 0)
    per_dir = []
    for d in range(ndir):
        f, g = acts[2 * d: 2 * d + 2]
        wb, rb = Bias[d][:3 * H], Bias[d][3 * H:]
        xw = em.op("Add", [em.op("MatMul", [x, em.const(W[d].T.copy(), "Wt")]), em.const(wb, "wb")])
        rt_zr, rt_h = em.const(R[d][:2 * H].T.copy(), "Rzr"), em.const(R[d][2 * H:].T.copy(), "Rh")
        rb_zr, rb_h = em.const(rb[:2 * H], "rbzr"), em.const(rb[2 * H:], "rbh")
        h = _initial(em, ins, 5, d, B, H, W.dtype, a.get("layout", 0))
        ys = {}
        for t in _steps(direction, d, T):
            xt = em.reshape(em.take(xw, t), [B, 3 * H])
            hzr = em.op("Add", [em.op("MatMul", [h, rt_zr]), rb_zr])
            z = _act(em, f, em.op("Add", [em.slice(xt, 0, H, 1), em.slice(hzr, 0, H, 1)]), clip)
            r = _act(em, f, em.op("Add", [em.slice(xt, H, 2 * H, 1), em.slice(hzr, H, 2 * H, 1)]), clip)
            if lbr:
                rec = em.op("Mul", [r, em.op("Add", [em.op("MatMul", [h, rt_h]), rb_h])])
            else:
                rec = em.op("Add", [em.op("MatMul", [em.op("Mul", [r, h]), rt_h]), rb_h])
            hh = _act(em, g, em.op("Add", [em.slice(xt, 2 * H, 3 * H, 1), rec]), clip)
            h = em.op("Add", [hh, em.op("Mul", [z, em.op("Sub", [h, hh])])])  # (1-z)*hh + z*h
            ys[t] = h
        per_dir.append(([ys[t] for t in range(T)], h, None))
    _finish(node, em, a, per_dir, T, B, H, ndir)
