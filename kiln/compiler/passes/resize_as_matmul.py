"""ResizeAsMatmul: a bilinear resize of a small feature map as two matmuls by constant interpolation
matrices, out = Rh @ x @ Rw^T (per image and channel), instead of topi's resize.

Segmentation models end by upsampling their logits bilinearly to the input size (DeepLabV3 and LRASPP:
[1, 21, 14 or 28, 14 or 28] -> [1, 21, 224, 224]). topi computes every output pixel's source
coordinates, floors, clamps and four gathers: 1.1 ms for DeepLabV3's, 15% of the model once its convs
were fast, at 4 GB/s. Bilinear interpolation is separable and linear: each output row is a mix of
two input rows with constant weights, so the resize is [OH, H] x [.., H, W] x [W, OW] with
matrices built here, and the matmul schedule runs it at the output's write bandwidth.
The matrices follow topi's arithmetic (source coordinate per mode, floor, indices clamped to the
edge), so the result is the same up to float rounding. Only float32 NCHW linear resizes of maps at
most MAX_INPUT wide and high are rewritten (the work per output pixel grows with the input size:
an input-sized resize stays topi's). `stats["resize_as_matmul"]` counts them."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

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


def interpolation_matrix(size: int, out: int, mode: str) -> np.ndarray:
    """[out, size] linear-interpolation weights: row o mixes inputs floor(c) and floor(c)+1 (clamped)."""
    c = source_coordinate(np.arange(out), size, out, mode)
    lo = np.floor(c).astype(np.int64)
    w = (c - lo.astype(np.float32)).astype(np.float64)
    m = np.zeros((out, size))
    rows = np.arange(out)
    np.add.at(m, (rows, np.clip(lo, 0, size - 1)), 1.0 - w)
    np.add.at(m, (rows, np.clip(lo + 1, 0, size - 1)), w)
    return m.astype(np.float32)


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
    rh = relax.const(interpolation_matrix(h, oh, mode))
    rw_t = relax.const(np.ascontiguousarray(interpolation_matrix(w, ow, mode).T))
    # the cheaper order: columns first costs H*OW*W + OH*OW*H multiply-adds per channel, rows first OH*W*H + OH*OW*W
    if h * ow * w + oh * ow * h <= oh * w * h + oh * ow * w:
        return relax.op.matmul(rh, builder.emit(relax.op.matmul(x, rw_t)))
    return relax.op.matmul(builder.emit(relax.op.matmul(rh, x)), rw_t)


@tvm.transform.module_pass(opt_level=1, name="ResizeAsMatmul")
class ResizeAsMatmul:
    def __init__(self):
        self.stats = {"resize_as_matmul": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(mod, _rewrite)
        self.stats["resize_as_matmul"] += count
        return out
