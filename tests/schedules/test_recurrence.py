"""The one-kernel LSTM/GRU/RNN layer (schedules/rules/recurrence.py) against NumPy's step-by-step recurrence:
each cell, both GRU forms, reverse and bidirectional, a batch, hidden sizes that are and are not a multiple
of the lanes; compiled for AVX2 (haswell, runs on any x86-64 host) with AVX2's and AVX-512's tiles (the
16-lane form is legal LLVM on AVX2 too: it splits the vectors), and for the host."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from kiln.schedules.rules.recurrence import Recurrence, kernel, specialize


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def reference(rec: Recurrence, xw, rt, rbh, h0, c0):
    T, H, G = rec.steps, rec.hidden, rec.gates
    y = np.zeros((T, rec.directions, rec.batch, H), np.float32)
    yh, yc = np.zeros_like(h0), np.zeros_like(h0)
    for d in range(rec.directions):
        h, c = h0[d].copy(), c0[d].copy()
        for s in range(T):
            t = T - 1 - s if rec.reverse[d] else s
            x = xw[t][:, d * G * H : (d + 1) * G * H]
            if rec.cell == "lstm":
                g = x + h @ rt[d]
                i, o, f = _sigmoid(g[:, :H]), _sigmoid(g[:, H : 2 * H]), _sigmoid(g[:, 2 * H : 3 * H])
                c = f * c + i * np.tanh(g[:, 3 * H :])
                h = o * np.tanh(c)
            elif rec.cell == "rnn":
                h = np.tanh(x + h @ rt[d])
            else:
                zr = x[:, : 2 * H] + h @ rt[d][:, : 2 * H]
                z, r = _sigmoid(zr[:, :H]), _sigmoid(zr[:, H:])
                if rec.linear_before_reset:
                    hh = np.tanh(x[:, 2 * H :] + r * (h @ rt[d][:, 2 * H :] + rbh[d]))
                else:
                    hh = np.tanh(x[:, 2 * H :] + (r * h) @ rt[d][:, 2 * H :] + rbh[d])
                h = (1 - z) * hh + z * h
            y[t, d] = h
        yh[d], yc[d] = h, c
    return [y, yh] + ([yc] if rec.cell == "lstm" else [])


CASES = [
    Recurrence("gru", 6, 1, 24, (False,)),
    Recurrence("gru", 5, 2, 20, (False, True), linear_before_reset=True),
    Recurrence("lstm", 4, 1, 40, (False, True)),
    Recurrence("lstm", 5, 3, 13, (True,)),
    Recurrence("rnn", 6, 1, 17, (False, True)),
]


def _run(func, rec: Recurrence, mcpu: str, seed: int):
    rng = np.random.default_rng(seed)
    D, B, H, G = rec.directions, rec.batch, rec.hidden, rec.gates
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
    ins = [f32(rec.steps, B, D * G * H), f32(D, H, G * H) * np.float32(0.3), f32(D, H), f32(D, B, H), f32(D, B, H)]
    args = ins[:2] + ([ins[2]] if rec.cell == "gru" else []) + [ins[3]] + ([ins[4]] if rec.cell == "lstm" else [])
    want = reference(rec, *ins)
    outs = [np.zeros_like(w) for w in want]
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    lib = tvm.compile(tvm.IRModule({"recurrence": func}), target=target)
    tensors = [tvm.runtime.tensor(a) for a in args + outs]
    lib["recurrence"](*tensors)
    return [t.numpy() for t in tensors[len(args) :]], want


@pytest.mark.parametrize("rec", CASES, ids=lambda r: f"{r.cell}-H{r.hidden}-D{r.directions}-B{r.batch}")
@pytest.mark.parametrize("lanes,registers", [(8, 16), (16, 32)])
def test_kernel_matches_numpy(rec, lanes, registers):
    got, want = _run(kernel(rec, lanes, registers), rec, "haswell", seed=rec.hidden)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)


def test_specialize_keeps_the_attributes_and_changes_the_tile():
    rec = CASES[2]
    generic = kernel(rec).without_attr("global_symbol").with_attr("kiln.mark", 1)
    wide = specialize(generic, 16, 32)
    assert wide.attrs["kiln.mark"] == 1 and "global_symbol" not in wide.attrs
    assert wide.attrs["kiln.flops"] == rec.flops() == 2 * 2 * 4 * 1 * 40 * 4 * 40
    assert "T.vectorized(16)" in wide.script() and "T.vectorized(16)" not in generic.script()
    assert specialize(tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0)), 16, 32) is None
    got, want = _run(wide.with_attr("global_symbol", "recurrence"), rec, "haswell", seed=3)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)


def _quantized(h: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """onnxruntime's dynamic uint8 quantization of h (contrib_quant._dynamic_quant): (q - zero point, scale)."""
    f = np.float32
    hi, lo = max(f(0), h.max()), min(f(0), h.min())
    scale = f(1) if hi - lo == 0 else f(hi - lo) / f(255)
    zp = np.round(min(max(f(0) - lo / scale, f(0)), f(255)))
    return np.clip(np.round(h / scale) + zp, 0, 255).astype(f) - zp, scale


@pytest.mark.parametrize("rec", [Recurrence("lstm", 5, 2, 20, (False, True), quantized_h=True)], ids=["lstm-q"])
@pytest.mark.parametrize("lanes,registers", [(8, 16), (16, 32)])
def test_quantized_h_matches_onnxruntimes_arithmetic(rec, lanes, registers):
    """DynamicQuantizeLSTM's step (frontends/decompose/contrib_quant.py): h quantized over every batch row, its
    integer values times integer-valued weights (exact in float32), then times scale x the column's scale."""
    rng = np.random.default_rng(5)
    D, B, H, G, T = rec.directions, rec.batch, rec.hidden, rec.gates, rec.steps
    xw = rng.standard_normal((T, B, D * G * H)).astype(np.float32)
    rint = rng.integers(-127, 128, (D, H, G * H)).astype(np.float32)
    rs = (rng.random((D, G * H)) * 0.004 + 0.001).astype(np.float32)
    h0, c0 = rng.standard_normal((2, D, B, H)).astype(np.float32)
    y = np.zeros((T, D, B, H), np.float32)
    for d in range(D):
        h, c = h0[d].copy(), c0[d].copy()
        for s in range(T):
            t = T - 1 - s if rec.reverse[d] else s
            hq, scale = _quantized(h)
            g = xw[t][:, d * G * H : (d + 1) * G * H] + (hq @ rint[d]) * (scale * rs[d])
            i, o, f = _sigmoid(g[:, :H]), _sigmoid(g[:, H : 2 * H]), _sigmoid(g[:, 2 * H : 3 * H])
            c = f * c + i * np.tanh(g[:, 3 * H :])
            h = o * np.tanh(c)
            y[t, d] = h
    target = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
    lib = tvm.compile(tvm.IRModule({"recurrence": kernel(rec, lanes, registers)}), target=target)
    outs = [np.zeros_like(y), np.zeros_like(h0), np.zeros_like(c0)]
    tensors = [tvm.runtime.tensor(a) for a in (xw, rint, rs, h0, c0, *outs)]
    lib["recurrence"](*tensors)
    np.testing.assert_allclose(tensors[5].numpy(), y, rtol=1e-5, atol=2e-6)
