"""Winograd F(m x m, 3 x 3) for 3x3 stride-1 convolutions in NCHW{c}c: 36 (m=4) or 16 (m=2)
multiplies per m x m output tile and channel pair instead of 9 m^2, at the cost of an input
and an output transform (and weights transformed once, at compile time, into alpha^2 / 9 times
the bytes: 4x for F(4x4), 1.8x for F(2x2)).

The transforms are written out with only the nonzero coefficients of A, B and G (TVM's
const_matrix would multiply by every zero), each as two 1-D passes (rows, then columns), so
the schedule can unroll them into straight-line vector code. Blocks: winograd_input_rows,
winograd_input (V), winograd_gemm (M, the anchor: it declares the kernel's kind), winograd_output_rows,
winograd_output (Y)."""

from __future__ import annotations

import numpy as np
from tvm import te, tirx, topi
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

from ..schedules.rules.kinds import declare

MIN_F4 = 16  # outputs at least this high and wide take F(4x4, 3x3), smaller ones F(2x2, 3x3)


def matrices(m: int, r: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A [alpha, m], B [alpha, alpha], G [alpha, r]) for F(m, r), alpha = m + r - 1."""
    a, b, g = _cook_toom_convolution(_interpolation_points(m + r - 2), m, r)
    return np.asarray(a, "float64"), np.asarray(b, "float64"), np.asarray(g, "float64")


def tile_size(h: int, w: int) -> int:
    """The output tile size m. Tiles cover the output; the last row/column of tiles may overhang
    it. F(4x4) stores 36/9 of the weights and F(2x2) 16/9: at 14x14 x 256 channels F(4x4) is
    faster alone (weights in cache; benchmarks/history.md) but not measurably so in
    ResNet-50, where each weight is read once from memory; F(2x2) keeps artifacts smaller."""
    return 4 if min(h, w) >= MIN_F4 else 2


def _combine(coef: np.ndarray, index, term):
    """sum_k coef[k, index] * term(k), with `index` an iteration variable: a select over its
    values of sums of the nonzero terms only (the schedule unrolls `index`, folding the select)."""

    def sum_for(j):
        parts = [
            term(k) if c == 1 else term(k) * tirx.const(float(c), "float32") for k, c in enumerate(coef[:, j]) if c != 0
        ]
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out

    expr = sum_for(coef.shape[1] - 1)
    for j in reversed(range(coef.shape[1] - 1)):
        expr = tirx.Select(index == j, sum_for(j), expr)
    return expr


def transform_weight(kernel: np.ndarray, m: int) -> np.ndarray:
    """[O/c, I/c, 3, 3, c(i), c(o)] -> U [alpha, alpha, O/c, I, c(o)] = G g G^T per channel pair,
    computed once at compile time (in float64, stored as float32)."""
    ob, ib, kh, kw, ci, co = kernel.shape
    _, _, g = matrices(m)
    w = kernel.astype("float64").transpose(0, 1, 4, 2, 3, 5).reshape(ob, ib * ci, kh, kw, co)
    return np.ascontiguousarray(np.einsum("er,ns,oirsj->enoij", g, g, w, optimize=True)).astype("float32")


def conv2d_winograd_nchwc(data, weight, m: int, out_dtype: str = "float32"):
    """data [N, C/c, H, W, c], U from transform_weight (float32, or bf16/fp16: widened to float32 as it
    is read) -> [N, O/c, H, W, c]; padding 1, stride 1.
    The tiles of all N images form one tile axis (p = image * tiles per image + tile), so a batch
    makes the GEMMs taller, not more numerous."""
    n, cb, h, w, c = data.shape
    alpha, _, ob, ci_total, oc = weight.shape
    a, b, _ = matrices(m)
    nh, nw = -(-int(h) // m), -(-int(w) // m)  # tiles cover the output, the last ones may overhang
    per_image = nh * nw
    p_total = int(n) * per_image
    # the last tile reads input rows up to nh * m + 1 (padded coordinates)
    padded = topi.nn.pad(
        data, [0, 0, 1, 1, 0], [0, 0, nh * m + 1 - int(h), nw * m + 1 - int(w), 0], name="winograd_pad"
    )
    # V = B^T d B, per tile p and input channel: rows first (over the tile's row index), then columns
    rows = te.compute(
        (alpha, cb, p_total, alpha, c),
        lambda e, i, p, x, k: _combine(
            b, e, lambda r: padded[p // per_image, i, (p % per_image // nw) * m + r, (p % nw) * m + x, k]
        ),
        name="winograd_input_rows",
    )
    v = te.compute(
        (alpha, alpha, cb, p_total, c),
        lambda e, u, i, p, k: _combine(b, u, lambda r: rows[e, i, p, r, k]),
        name="winograd_input",
    )
    # M[e, u] = V[e, u] @ U[e, u]: alpha^2 independent GEMMs of [tiles x I] by [I x O]
    k = te.reduce_axis((0, ci_total), name="k")
    gemm = te.compute(
        (alpha, alpha, ob, p_total, oc),
        lambda e, u, o, p, j: te.sum(v[e, u, k // c, p, k % c] * weight[e, u, o, k, j].astype("float32"), axis=[k]),
        name="winograd_gemm",
        attrs=declare("winograd"),
    )
    # Y = A^T M A: rows, then columns; the output is written tile by tile in NCHW{c}c
    out_rows = te.compute(
        (ob, p_total, m, alpha, oc),
        lambda o, p, y, u, j: _combine(a, y, lambda r: gemm[r, u, o, p, j]),
        name="winograd_output_rows",
    )
    return te.compute(
        (n, ob, h, w, oc),
        lambda _n, o, y, x, j: _combine(
            a, x % m, lambda r: out_rows[o, _n * per_image + (y // m) * nw + x // m, y % m, r, j]
        ).astype(out_dtype),
        name="winograd_output",
    )
