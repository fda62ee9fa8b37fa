"""conv3d (NCDHW data, OIDHW weights) to Kiln's compute with output channels vectorized: the weights
re-laid out as [O/c, I, KD, KH, KW, c] (a constant transform, folded at compile time), so the
schedule (schedules/rules/conv3d.py) loads c output channels' weights with one vector load and
broadcasts each input value into them. TVM's own conv3d compute has no schedule in Kiln: the
generic reduction rule ran r3d_18 (a video ResNet) far behind onnxruntime (timings in benchmarks/history.md)."""

from __future__ import annotations

from tvm import te, topi

from ..schedules.rules.kinds import declare
from . import ir
from .passes.convert_layout import widest_block


def conv3d_oc_blocked(data, kernel, strides, padding, dilation, out_dtype):
    """data [N, C, D, H, W], kernel [O/c, C, KD, KH, KW, c]; padding [front, top, left, back, bottom, right]."""
    n, _, d, h, w = data.shape
    ob, c_in, kd, kh, kw, c = kernel.shape
    (sd, sh, sw), (dd, dh, dw) = strides, dilation
    pf, pt, pl, pk, pb, pr = padding
    padded = topi.nn.pad(data, [0, 0, pf, pt, pl], [0, 0, pk, pb, pr], name="pad_temp")
    od = (d + pf + pk - dd * (kd - 1) - 1) // sd + 1
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    ic = te.reduce_axis((0, c_in), name="ic")
    rz, ry, rx = (te.reduce_axis((0, k), name=nm) for k, nm in ((kd, "rz"), (kh, "ry"), (kw, "rx")))
    return te.compute(
        (n, ob * c, od, oh, ow),
        lambda b, o, z, y, x: te.sum(
            padded[b, ic, z * sd + rz * dd, y * sh + ry * dh, x * sw + rx * dw].astype(out_dtype)
            * kernel[o // c, ic, rz, ry, rx, o % c].astype(out_dtype),
            axis=[ic, rz, ry, rx],
        ),
        name="conv3d_ncdhw_oc",
        attrs=declare("conv3d"),
    )


def conv3d(bb, call, lanes: int, fallback):
    """The call lowered to conv3d_oc_blocked, or `fallback(bb, call)` (TVM's) where it does not fit:
    other layouts, groups, non-float32, output channels with no power-of-two block of 4 or more."""
    a = call.attrs
    x, w = call.args
    out_dtype = ir.out_dtype(a) or str(call.ty.dtype)
    shape = [int(v) for v in w.ty.shape] if w.ty.shape is not None else None
    c = widest_block(shape[0], lanes) if shape else 1
    if (
        (a.data_layout, a.kernel_layout, a.out_layout) != ("NCDHW", "OIDHW", "NCDHW")
        or int(a.groups) != 1
        or c < 4
        or {str(x.ty.dtype), str(w.ty.dtype), out_dtype} != {"float32"}
    ):
        return fallback(bb, call)
    o = shape[0]
    blocked = bb.emit_te(
        lambda k: te.compute(
            (o // c, *shape[1:], c), lambda b, i, z, y, xx, j: k[b * c + j, i, z, y, xx], name="conv3d_weights"
        ),
        w,
        primfunc_name_hint="conv3d_weights",
    )
    return bb.call_te(
        conv3d_oc_blocked,
        x,
        blocked,
        [int(v) for v in a.strides],
        [int(v) for v in a.padding],
        [int(v) for v in a.dilation],
        out_dtype,
        primfunc_name_hint="conv3d",
    )
