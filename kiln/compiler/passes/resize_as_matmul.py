"""ResizeAsMatmul: a bilinear resize of a small feature map as a matmul by a constant interpolation
matrix along the rows' inner axis, x @ Rw^T, then a two-row lerp per output row (per image and channel),
instead of topi's resize.

Segmentation models end by upsampling their logits bilinearly to the input size (DeepLabV3 and LRASPP:
[1, 21, 14 or 28, 14 or 28] -> [1, 21, 224, 224]). topi computes every output pixel's source
coordinates, floors, clamps and four gathers: a large share of DeepLabV3 once its convs were fast, far
below the memory's bandwidth (timings in benchmarks/history.md). Bilinear interpolation is separable and linear:
each output row is a mix of two input rows with constant weights, so the resize is [.., H, W] x [W, OW] (a matrix
built here) and then out[.., o, :] = y[.., lo[o], :] * (1 - w[o]) + y[.., hi[o], :] * w[o] on whole contiguous rows.
The matrices follow topi's arithmetic (source coordinate per mode, floor, indices clamped to the
edge), so the result is the same up to float rounding. Only float32 NCHW linear resizes of maps at
most MAX_INPUT wide and high are rewritten (the work per output pixel grows with the input size:
an input-sized resize stays topi's). `stats["resize_as_matmul"]` counts them."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te

from ...counters import Counter
from ..ir import op_name
from .counting import static_shape
from .module_map import rewrite_calls

MAX_INPUT = 64  # rows/columns of the input: the matmuls do 2 x (input size) multiply-adds per output pixel
MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")


def source_coordinate(o: np.ndarray, size: int, out: int, mode: str) -> np.ndarray:
    """topi's get_inx: the input coordinate output position o reads (float32, as topi computes it)."""
    f = np.float32
    scale = f(size) / f(out)
    o = o.astype(f)
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and out > 1):
        return (o + f(0.5)) * scale - f(0.5)
    if mode == "align_corners":
        return (f(size - 1) / f(out - 1) if out > 1 else f(0)) * o
    if mode == "asymmetric":
        return scale * o
    return np.zeros_like(o)  # pytorch_half_pixel of a 1-wide output


def taps(size: int, out: int, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output position o mixes inputs lo[o] and hi[o] (floor(c) and floor(c)+1, clamped) with weights 1 - w, w."""
    c = source_coordinate(np.arange(out), size, out, mode)
    lo = np.floor(c).astype(np.int64)
    w = (c - lo.astype(np.float32)).astype(np.float64)
    return np.clip(lo, 0, size - 1), np.clip(lo + 1, 0, size - 1), w


def interpolation_matrix(size: int, out: int, mode: str) -> np.ndarray:
    """[out, size] linear-interpolation weights: row o mixes inputs lo[o] and hi[o]."""
    lo, hi, w = taps(size, out, mode)
    m = np.zeros((out, size))
    rows = np.arange(out)
    np.add.at(m, (rows, lo), 1.0 - w)
    np.add.at(m, (rows, hi), w)
    return m.astype(np.float32)


def mix_rows(builder, y, size: int, out: int, mode: str):
    """The rows step, out[.., o, :] = y[.., lo[o], :] * (1 - w[o]) + y[.., hi[o], :] * w[o], as one kernel: 2
    multiply-adds per output pixel against the matmul's `size`, on whole contiguous rows (LRASPP's
    [224, 28] x [21, 28, 224] matmul; benchmarks/history.md). The taps are constants the kernel reads."""
    lo, hi, w = taps(size, out, mode)
    tables = [relax.const(lo.astype(np.int32)), relax.const(hi.astype(np.int32)), relax.const(w.astype(np.float32))]

    def compute(y, lo, hi, w):
        one = tvm.tirx.const(1.0, "float32")
        return te.compute(
            (*y.shape[:2], out, y.shape[3]),
            lambda n, c, o, j: y[n, c, lo[o], j] * (one - w[o]) + y[n, c, hi[o], j] * w[o],
            name="T_resize_rows",
        )

    return builder.call_te(compute, y, *tables, primfunc_name_hint="resize_rows")


def _rewrite(builder, call):
    if op_name(call) != "relax.image.resize2d":
        return None
    a = call.attrs
    x = call.args[0]
    xs, out = static_shape(x), static_shape(call)
    mode = str(a.coordinate_transformation_mode)
    if (
        str(a.method) != "linear"
        or str(a.layout) != "NCHW"
        or mode not in MODES
        or xs is None
        or out is None
        or len(xs) != 4
        or str(x.ty.dtype) != "float32"
        or str(call.ty.dtype) != "float32"
    ):
        return None
    (h, w), (oh, ow) = xs[2:], out[2:]
    if not (2 <= h <= MAX_INPUT and 2 <= w <= MAX_INPUT) or oh < h or ow < w:
        return None
    rw_t = relax.const(np.ascontiguousarray(interpolation_matrix(w, ow, mode).T))
    # columns first (H*OW*W multiply-adds per channel: the inner axis, a matmul), then rows (2 per output pixel)
    return mix_rows(builder, builder.emit(relax.op.matmul(x, rw_t)), h, oh, mode)


# what ResizeAsMatmul counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("resize_as_matmul", int, "bilinear resizes as matmuls"),)


@tvm.transform.module_pass(opt_level=1, name="ResizeAsMatmul")
class ResizeAsMatmul:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"resize_as_matmul": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(mod, _rewrite)
        self.stats["resize_as_matmul"] += count
        return out
