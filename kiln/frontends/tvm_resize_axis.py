"""One axis of an ONNX Resize whose geometry is known only at run time (scales, sizes or roi fed as tensors).
onnx's reference resizes one axis at a time (op_resize._interpolate_1d_along_axis), and so does this, with
the coordinate transform computed per run in float64 from 0-d tensors, as the reference does:

- nearest: a gather at the rounded source coordinates (exact, any dtype).
- linear / cubic, with or without antialias and exclude_outside: an (out, in) weight matrix applied as a
  matmul along the axis. Each output's weights are the op's kernel at its distance to every integer
  position within a static margin around the input, taps beyond the edges folded onto the edge pixel (the
  reference's edge padding), then normalized (antialias and exclude_outside renormalize; linear and cubic
  kernels already sum to 1). The margin covers the widest antialias kernel an output of at least one
  element can have (scale >= 1/n: 2/scale <= 2n input pixels for cubic), so no tap is lost. A dense
  matrix where the constant-geometry paths use two or four taps: run-time geometry is the rare case.
- tf_crop_and_resize: outputs whose source falls outside the input take the extrapolation value, per axis
  (so later axes interpolate across it, as in the reference)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Axis:
    """One resized axis: its static input length, its output length (a symbolic dim), and 0-d float64
    tensors holding its scale factor and, for tf_crop_and_resize, its roi start and end."""

    axis: int
    n: int
    out: object
    scale: object
    roi: tuple | None = None


@dataclass
class Options:
    mode: str = "nearest"
    ctm: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False
    extrapolation: float = 0.0


def _f(v):
    from tvm import relax

    return relax.const(float(v), "float64")


def source_coordinate(pos, ax: Axis, ctm: str):
    """onnx's reference _compute_x_ori: the input coordinate of output positions pos (float64). As the
    reference (and Kiln's constant-geometry path, decompose/standard_spatial.py, which runs it), align_corners,
    tf_crop_and_resize and pytorch_half_pixel use the unrounded output length scale * n; onnxruntime uses the
    rounded one, which differs where scale * n is not a whole number."""
    from tvm import relax

    op = relax.op
    n, s = ax.n, ax.scale
    width = op.multiply(s, _f(n))  # the output's length before rounding
    one = op.equal(width, _f(1))
    centered = op.subtract(op.divide(op.add(pos, _f(0.5)), s), _f(0.5))
    if ctm == "align_corners":
        return op.where(one, _f(0), op.divide(op.multiply(pos, _f(n - 1)), op.subtract(width, _f(1))))
    if ctm == "asymmetric":
        return op.divide(pos, s)
    if ctm == "tf_crop_and_resize":
        r0, r1 = ax.roi
        span = op.multiply(op.subtract(r1, r0), _f(n - 1))
        inner = op.divide(op.multiply(pos, span), op.subtract(width, _f(1)))
        return op.add(op.where(one, op.divide(span, _f(2)), inner), op.multiply(r0, _f(n - 1)))
    if ctm == "pytorch_half_pixel":
        return op.where(one, _f(-0.5), centered)
    if ctm == "half_pixel_symmetric":
        length = op.reshape(op.astype(op.shape_to_tensor(relax.ShapeExpr([ax.out])), "float64"), [])
        offset = op.multiply(_f(n / 2), op.subtract(_f(1), op.divide(length, width)))
        return op.add(offset, centered)
    return centered  # half_pixel


def _nearest_index(x, method: str):
    """ONNX's nearest_mode on float64 coordinates (the reference's tie rules)."""
    from tvm import relax

    op = relax.op
    if method == "floor":
        return op.floor(x)
    if method == "ceil":
        return op.ceil(x)
    if method == "round_prefer_ceil":
        return op.floor(op.add(x, _f(0.5)))
    return op.ceil(op.subtract(x, _f(0.5)))  # round_prefer_floor: ties go down


def _kernel(dist, opt: Options):
    """The interpolation kernel at distances dist >= 0 (in kernel units)."""
    from tvm import relax

    op = relax.op
    if opt.mode == "linear":
        return op.maximum(op.subtract(_f(1), dist), _f(0))
    a = opt.cubic_a
    d2 = op.multiply(dist, dist)
    d3 = op.multiply(d2, dist)
    near = op.add(op.subtract(op.multiply(_f(a + 2), d3), op.multiply(_f(a + 3), d2)), _f(1))
    far = op.add(
        op.subtract(op.multiply(_f(a), d3), op.multiply(_f(5 * a), d2)),
        op.subtract(op.multiply(_f(8 * a), dist), _f(4 * a)),
    )
    return op.where(op.less_equal(dist, _f(1)), near, op.where(op.less(dist, _f(2)), far, _f(0)))


def _weights(bb, x, ax: Axis, opt: Options):
    """(out, n) float64: each output's weights over the input positions."""
    from tvm import relax

    op = relax.op
    radius = 2 if opt.mode == "cubic" else 1
    margin = radius * ax.n + 3 if opt.antialias else radius + 2
    taps = np.arange(-margin, ax.n + margin)
    k = relax.const(taps.astype(np.float64).reshape(1, -1), "float64")
    dist = op.abs(op.subtract(k, op.expand_dims(x, 1)))  # (out, taps)
    if opt.antialias:  # the kernel stretched by 1/scale when downsampling
        dist = op.multiply(dist, op.minimum(ax.scale, _f(1)))
    w = _kernel(dist, opt)
    if opt.exclude_outside:
        inside = ((taps >= 0) & (taps < ax.n)).astype(np.float64).reshape(1, -1)
        w = op.multiply(w, relax.const(inside, "float64"))
    w = bb.normalize(w)
    total = op.sum(w, axis=[1], keepdims=True)
    w = op.divide(w, op.where(op.equal(total, _f(0)), _f(1), total))
    fold = np.zeros((len(taps), ax.n))
    fold[np.arange(len(taps)), np.clip(taps, 0, ax.n - 1)] = 1  # edge padding: outside taps read the edge
    return bb.normalize(op.matmul(w, relax.const(fold, "float64")))


def resize_axis(bb, data, ax: Axis, opt: Options):
    """data resized along ax.axis to ax.out elements."""
    from tvm import relax

    op = relax.op
    pos = bb.normalize(op.arange(0, ax.out, 1, "float64"))
    x = bb.normalize(source_coordinate(pos, ax, opt.ctm))
    rank = data.ty.ndim
    if opt.mode == "nearest":
        idx = op.clip(_nearest_index(x, opt.nearest_mode), 0, ax.n - 1)
        y = bb.normalize(op.take(data, bb.normalize(op.astype(idx, "int64")), axis=ax.axis))
    else:
        dtype = data.ty.dtype if str(data.ty.dtype) in ("float32", "float64") else "float32"
        w = op.astype(op.permute_dims(_weights(bb, x, ax, opt)), dtype)  # (n, out)
        perm = [d for d in range(rank) if d != ax.axis] + [ax.axis]
        moved = op.permute_dims(op.astype(data, dtype), perm)
        y = op.matmul(moved, w)
        inv = [int(i) for i in np.argsort(perm)]
        y = bb.normalize(op.astype(op.permute_dims(y, inv), data.ty.dtype))
    if opt.ctm == "tf_crop_and_resize":
        outside = op.logical_or(op.less(x, _f(0)), op.greater(x, _f(ax.n - 1)))
        mask = op.expand_dims(outside, [d for d in range(rank) if d != ax.axis])
        y = bb.normalize(op.where(mask, relax.const(opt.extrapolation, data.ty.dtype), y))
    return y
