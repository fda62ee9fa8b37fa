"""LSTM, GRU and RNN as unrolled primitive ONNX ops (shapes are pinned, so the sequence length is
static): one MatMul for the input projection of all time steps, then per step one MatMul with the
recurrent weights, gate slices and elementwise math, exactly as the ONNX spec defines them.
Weights that are constants are pre-transposed here; weights fed as graph inputs (W, R, B, P) get
the same slicing and transposes as ONNX ops. A sequence_lens that is not all T masks each step
(state kept, output zeroed past a batch entry's length), which is the spec's padding semantics."""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable

import numpy as np
import onnx

from ...errors import UnsupportedModelError
from ...schedules.rules.recurrence import GATES
from ..tvm_recurrence import DOMAIN, OP_TYPE
from .emitter import CURRENT_MODEL, Emitter
from .llm_common import elem_type

ACTIVATIONS = {"Sigmoid": "Sigmoid", "Tanh": "Tanh", "Relu": "Relu"}
DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
CELLS = {"LSTM": "lstm", "GRU": "gru", "RNN": "rnn"}
# the importer's choice: False for GPU targets (the one-kernel recurrence is a CPU kernel), which keep the steps
ONE_KERNEL: contextvars.ContextVar = contextvars.ContextVar("kiln_one_kernel_recurrence", default=True)


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class _Weights:
    """Per-direction views of W/R/B/P, as constants where the tensor is one, else as emitted ops."""

    def __init__(self, em: Emitter, consts, x: str):
        self.em, self.consts, self.x = em, consts, x

    def mat_t(self, name: str, d: int, r0: int, r1: int, hint: str) -> str:
        """name[d][r0:r1].T (a [cols, r1-r0] matrix)."""
        if name in self.consts:
            return self.em.const(np.ascontiguousarray(self.consts[name][d][r0:r1].T), hint)
        return self.em.op("Transpose", [self.em.slice(self._row(name, d), r0, r1, 0)], perm=[1, 0])

    def _row(self, name: str, d: int) -> str:
        """name[d] with the direction axis dropped, by Gather with a scalar index (opset-independent)."""
        return self.em.op("Gather", [name, self.em.const(np.array(d, np.int64), "d")], axis=0)

    def vec(self, name: str, d: int, s0: int, s1: int, hint: str) -> str:
        if name in self.consts:
            return self.em.const(np.ascontiguousarray(self.consts[name][d][s0:s1]), hint)
        return self.em.slice(self._row(name, d), s0, s1, 0)

    def bias_sum(self, name: str, d: int, n: int, hint: str) -> str:
        """B[d][:n] + B[d][n:2n] (input and recurrent bias of the gates, added once)."""
        if name in self.consts:
            b = self.consts[name][d]
            return self.em.const(b[:n] + b[n : 2 * n], hint)
        return self.em.op("Add", [self.vec(name, d, 0, n, hint), self.vec(name, d, n, 2 * n, hint)])

    def scalar(self, value, hint: str = "k") -> str:
        """A scalar of X's dtype (CastLike keeps the decomposition dtype-generic)."""
        return self.em.op("CastLike", [self.em.const(np.array(value, np.float32), hint), self.x])


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
        raise UnsupportedModelError(
            f"{node.op_type} activations {bad} are not supported", where=where_n, fix=f"use {sorted(ACTIVATIONS)}"
        )
    x = ins[0]
    if x not in shapes:
        raise UnsupportedModelError(
            f"{node.op_type} input {x!r} has no static shape", where=where_n, fix="pin every input with --input-shape"
        )
    layout = a.get("layout", 0)
    T, B = (shapes[x][1], shapes[x][0]) if layout == 1 else (shapes[x][0], shapes[x][1])
    if layout == 1:
        x = em.op("Transpose", [x], perm=[1, 0, 2])
    H = a["hidden_size"]
    w = _Weights(em, consts, x)
    mask = None  # per step t: [B, 1] 1/0 of t < sequence_lens, or None when every length is T
    if ins[4] and not (ins[4] in consts and np.all(consts[ins[4]] == T)):
        lens = em.op("Cast", [em.reshape(ins[4], [B, 1])], to=onnx.TensorProto.INT64)
        mask = {
            t: em.op("CastLike", [em.op("Less", [em.const(np.array(t, np.int64), "t"), lens]), x]) for t in range(T)
        }
    return a, ins, x, ndir, direction, acts, T, B, H, w, mask


def _initial(em: Emitter, w: _Weights, ins, idx, d, B, H, layout: int) -> str:
    """Initial state of direction d: [dirs, B, H] (layout 0) or [B, dirs, H] (layout 1)."""
    if ins[idx]:
        return em.reshape(em.take(ins[idx], d, axis=1 if layout else 0), [B, H])
    return em.op("CastLike", [em.const(np.zeros((B, H), np.float32), "zeros"), w.x])


def _act(em: Emitter, w: _Weights, name: str, x: str, clip) -> str:
    if clip is not None:
        x = em.op("Min", [em.op("Max", [x, w.scalar(-clip)]), w.scalar(clip)])  # Clip's form varies by opset
    return em.op(ACTIVATIONS[name], [x])


def _steps(direction: str, d: int, T: int):
    reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
    return list(range(T - 1, -1, -1)) if reverse else list(range(T))


def _masked(em: Emitter, mask, t: int, new: str, old: str) -> str:
    """new where step t is inside the batch entry's sequence, else old (the state carried through)."""
    if mask is None:
        return new
    return em.op("Add", [old, em.op("Mul", [mask[t], em.op("Sub", [new, old])])])


def _out(em: Emitter, mask, t: int, h: str) -> str:
    return h if mask is None else em.op("Mul", [h, mask[t]])


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


def _project(em: Emitter, w: _Weights, x: str, ins, d: int, G: int, H: int, bias: str | None) -> str:
    """X @ W[d].T (+ bias) for all time steps at once: [T, B, G*H]."""
    xw = em.op("MatMul", [x, w.mat_t(ins[1], d, 0, G * H, "Wt")])
    return em.op("Add", [xw, bias]) if bias else xw


@dataclasses.dataclass(frozen=True)
class QuantizedWeights:
    """What DynamicQuantizeLSTM (contrib_quant.py) gives the one-kernel recurrence: the input projection of all
    steps, (em, rows [T*B, I]) -> [T*B, D*G*H] without bias (x quantized at run time, as onnxruntime does), and
    the recurrent weights as integer values [D, H, G*H] with their scales per column [D, G*H]; the kernel
    quantizes h to uint8 each step with onnxruntime's parameters (schedules/rules/recurrence.py)."""

    project: Callable
    r_int: np.ndarray
    r_scale: np.ndarray


def _input_weights(em: Emitter, W: np.ndarray) -> str:
    """The projection's weights, every direction's W transposed side by side: [I, D*G*H]."""
    return em.const(np.ascontiguousarray(np.concatenate([w.T for w in W.astype(np.float32)], axis=1)), "Wt")


def _recurrent_weights(em: Emitter, R: np.ndarray, quant: QuantizedWeights | None) -> list[str]:
    """The kernel's recurrent weights: R transposed per direction [D, H, G*H], or (a quantized layer, whose float
    R is not read) its integer values and their scales per column."""
    if quant is None:
        return [em.const(np.ascontiguousarray(np.stack([r.T for r in R.astype(np.float32)])), "Rt")]
    return [em.const(quant.r_int.astype(np.float32), "Rint"), em.const(quant.r_scale.astype(np.float32), "rs")]


def one_kernel(node, em: Emitter, shapes, consts, quant: QuantizedWeights | None = None) -> bool:
    """The layer as one KilnRecurrence node (tvm_recurrence.py: every step in one kernel) where it has
    float32 data, constant weights, the default activations and none of clip, peepholes, input_forget or
    a sequence_lens shorter than T; False (the caller unrolls it) otherwise. quant: a dynamically quantized
    LSTM's weights (the kernel then quantizes h every step)."""
    a = _attrs(node)
    ins = list(node.input) + [""] * (8 - len(node.input))
    direction = a.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    ndir = 2 if direction == "bidirectional" else 1
    acts = [x.decode() if isinstance(x, bytes) else x for x in a.get("activations", DEFAULT_ACTS[node.op_type] * ndir)]
    x, layout = ins[0], a.get("layout", 0)
    plain = acts == DEFAULT_ACTS[node.op_type] * ndir and not {"clip", "activation_alpha", "activation_beta"} & set(a)
    plain = plain and not a.get("input_forget", 0) and not ins[7] and x in shapes and len(shapes[x]) == 3
    plain = plain and all(ins[i] in consts for i in (1, 2)) and (not ins[3] or ins[3] in consts)
    if getattr(em, "unrolled", False) and quant is None:  # it rewrites the per-step MatMuls (contrib_quant.py)
        return False
    if not plain or not ONE_KERNEL.get() or elem_type(x) != onnx.TensorProto.FLOAT or CURRENT_MODEL.get() is None:
        return False
    T, B = (shapes[x][1], shapes[x][0]) if layout == 1 else (shapes[x][0], shapes[x][1])
    if ins[4] and not (ins[4] in consts and np.all(consts[ins[4]] == T)):
        return False
    cell, H = CELLS[node.op_type], a["hidden_size"]
    G = GATES[cell]
    Bb = consts[ins[3]].astype(np.float32) if ins[3] else np.zeros((ndir, 2 * G * H), np.float32)
    if cell == "gru":  # z and r take both biases in the projection; h's recurrent bias stays in the kernel
        bias = [
            Bb[d][: G * H] + np.concatenate([Bb[d][G * H : G * H + 2 * H], np.zeros(H, np.float32)])
            for d in range(ndir)
        ]
    else:
        bias = [Bb[d][: G * H] + Bb[d][G * H :] for d in range(ndir)]
    if layout == 1:
        x = em.op("Transpose", [x], perm=[1, 0, 2])
    rows = em.reshape(x, [T * B, shapes[ins[0]][-1]])  # [T*B, I]: a 2-D matmul takes the rows register tile
    projected = quant.project(em, rows) if quant else em.op("MatMul", [rows, _input_weights(em, consts[ins[1]])])
    xw = em.reshape(em.op("Add", [projected, em.const(np.concatenate(bias), "b")]), [T, B, ndir * G * H])
    inputs = [xw, *_recurrent_weights(em, consts[ins[2]], quant)]
    if cell == "gru":
        inputs.append(em.const(np.ascontiguousarray(Bb[:, G * H + 2 * H : G * H + 3 * H]), "rbh"))
    for idx in (5, 6) if cell == "lstm" else (5,):
        if not ins[idx]:
            inputs.append(em.const(np.zeros((ndir, B, H), np.float32), "zeros"))
        else:
            inputs.append(em.op("Transpose", [ins[idx]], perm=[1, 0, 2]) if layout == 1 else ins[idx])
    outs = list(node.output) + [""] * 3
    n_out = 3 if cell == "lstm" else 2
    names = [em.name(f"y{i}") if layout == 1 or not outs[i] else outs[i] for i in range(n_out)]
    reverse = [int(direction == "reverse" or d == 1) for d in range(ndir)]
    em.nodes.append(
        onnx.helper.make_node(
            OP_TYPE,
            inputs,
            names,
            name=em.name(OP_TYPE),
            domain=DOMAIN,
            cell=cell,
            reverse=reverse,
            linear_before_reset=int(a.get("linear_before_reset", 0)),
            quantized_h=int(quant is not None),
        )
    )
    model = CURRENT_MODEL.get()
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    dims = [[T, ndir, B, H], [ndir, B, H], [ndir, B, H]]
    model.graph.value_info.extend(
        onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, dims[i]) for i, n in enumerate(names)
    )  # ONNX's shape inference knows nothing of the node: later rounds read its outputs' shapes here
    if layout == 1:
        for i, perm in enumerate(([2, 0, 1, 3], [1, 0, 2], [1, 0, 2])[:n_out]):
            if outs[i]:
                em.op("Transpose", [names[i]], out=outs[i], perm=perm)
    return True


def decompose_lstm(node, em: Emitter, shapes, consts, where) -> None:
    if one_kernel(node, em, shapes, consts):
        return
    a, ins, x, ndir, direction, acts, T, B, H, w, mask = _setup(
        node, em, shapes, consts, where, 4, ["Sigmoid", "Tanh", "Tanh"]
    )
    clip, input_forget = a.get("clip"), a.get("input_forget", 0)
    layout = a.get("layout", 0)
    per_dir = []
    for d in range(ndir):
        f, g, hact = acts[3 * d : 3 * d + 3]
        xw = _project(em, w, x, ins, d, 4, H, w.bias_sum(ins[3], d, 4 * H, "b") if ins[3] else None)
        rt = w.mat_t(ins[2], d, 0, 4 * H, "Rt")
        pi, po, pf = (w.vec(ins[7], d, k * H, (k + 1) * H, "p") for k in range(3)) if ins[7] else (None,) * 3
        h, c = _initial(em, w, ins, 5, d, B, H, layout), _initial(em, w, ins, 6, d, B, H, layout)
        ys = {}
        for t in _steps(direction, d, T):
            gates = em.op("Add", [em.reshape(em.take(xw, t), [B, 4 * H]), em.op("MatMul", [h, rt])])
            gi, go, gf, gc = (em.slice(gates, k * H, (k + 1) * H, 1) for k in range(4))
            if pi is not None:
                gi = em.op("Add", [gi, em.op("Mul", [c, pi])])
                gf = em.op("Add", [gf, em.op("Mul", [c, pf])])
            i = _act(em, w, f, gi, clip)
            fg = em.op("Sub", [w.scalar(1.0), i]) if input_forget else _act(em, w, f, gf, clip)
            c_new = em.op("Add", [em.op("Mul", [fg, c]), em.op("Mul", [i, _act(em, w, g, gc, clip)])])
            if po is not None:
                go = em.op("Add", [go, em.op("Mul", [c_new, po])])
            h_new = em.op("Mul", [_act(em, w, f, go, clip), em.op(ACTIVATIONS[hact], [c_new])])
            ys[t] = _out(em, mask, t, h_new)
            h, c = _masked(em, mask, t, h_new, h), _masked(em, mask, t, c_new, c)
        per_dir.append(([ys[t] for t in range(T)], h, c))
    _finish(node, em, a, per_dir, T, B, H, ndir)


def decompose_gru(node, em: Emitter, shapes, consts, where) -> None:
    if one_kernel(node, em, shapes, consts):
        return
    a, ins, x, ndir, direction, acts, T, B, H, w, mask = _setup(node, em, shapes, consts, where, 3, ["Sigmoid", "Tanh"])
    clip, lbr = a.get("clip"), a.get("linear_before_reset", 0)
    per_dir = []
    for d in range(ndir):
        f, g = acts[2 * d : 2 * d + 2]
        xw = _project(em, w, x, ins, d, 3, H, w.vec(ins[3], d, 0, 3 * H, "wb") if ins[3] else None)
        rt_zr, rt_h = w.mat_t(ins[2], d, 0, 2 * H, "Rzr"), w.mat_t(ins[2], d, 2 * H, 3 * H, "Rh")
        rb_zr = w.vec(ins[3], d, 3 * H, 5 * H, "rbzr") if ins[3] else None
        rb_h = w.vec(ins[3], d, 5 * H, 6 * H, "rbh") if ins[3] else None
        add_b = lambda v, b: em.op("Add", [v, b]) if b else v
        h = _initial(em, w, ins, 5, d, B, H, a.get("layout", 0))
        ys = {}
        for t in _steps(direction, d, T):
            xt = em.reshape(em.take(xw, t), [B, 3 * H])
            hzr = add_b(em.op("MatMul", [h, rt_zr]), rb_zr)
            z = _act(em, w, f, em.op("Add", [em.slice(xt, 0, H, 1), em.slice(hzr, 0, H, 1)]), clip)
            r = _act(em, w, f, em.op("Add", [em.slice(xt, H, 2 * H, 1), em.slice(hzr, H, 2 * H, 1)]), clip)
            if lbr:
                rec = em.op("Mul", [r, add_b(em.op("MatMul", [h, rt_h]), rb_h)])
            else:
                rec = add_b(em.op("MatMul", [em.op("Mul", [r, h]), rt_h]), rb_h)
            hh = _act(em, w, g, em.op("Add", [em.slice(xt, 2 * H, 3 * H, 1), rec]), clip)
            h_new = em.op("Add", [hh, em.op("Mul", [z, em.op("Sub", [h, hh])])])  # (1-z)*hh + z*h
            ys[t] = _out(em, mask, t, h_new)
            h = _masked(em, mask, t, h_new, h)
        per_dir.append(([ys[t] for t in range(T)], h, None))
    _finish(node, em, a, per_dir, T, B, H, ndir)


def decompose_rnn(node, em: Emitter, shapes, consts, where) -> None:
    """The plain RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb), f Tanh by default."""
    if one_kernel(node, em, shapes, consts):
        return
    a, ins, x, ndir, direction, acts, T, B, H, w, mask = _setup(node, em, shapes, consts, where, 1, ["Tanh"])
    clip = a.get("clip")
    per_dir = []
    for d in range(ndir):
        f = acts[d]
        xw = _project(em, w, x, ins, d, 1, H, w.bias_sum(ins[3], d, H, "b") if ins[3] else None)
        rt = w.mat_t(ins[2], d, 0, H, "Rt")
        h = _initial(em, w, ins, 5, d, B, H, a.get("layout", 0))
        ys = {}
        for t in _steps(direction, d, T):
            h_new = _act(em, w, f, em.op("Add", [em.reshape(em.take(xw, t), [B, H]), em.op("MatMul", [h, rt])]), clip)
            ys[t] = _out(em, mask, t, h_new)
            h = _masked(em, mask, t, h_new, h)
        per_dir.append(([ys[t] for t in range(T)], h, None))
    _finish(node, em, a, per_dir, T, B, H, ndir)
