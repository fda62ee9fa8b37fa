"""Kiln's legalizations that TVM's defaults lack: conv2d in a blocked NCHW{n}c layout lowers to
topi's conv2d_NCHWc (TVM's default legalization skips blocked layouts and the build fails), and
depthwise conv2d in NCHW{n}c (PropagateBlockedLayout makes them) to Kiln's own compute.
Everything else falls through to TVM's registered legalizer."""
from __future__ import annotations

import tvm
from tvm import te, topi


def depthwise_conv2d_nchwc(data, kernel, strides, padding, dilation, out_dtype):
    """Depthwise conv2d, data [N, C/c, H, W, c], weight [C/c, 1, KH, KW, 1, c] (channel multiplier 1):
    TVM 0.27 has no compute for it. padding is [top, left, bottom, right]."""
    n, cb, h, w, c = data.shape
    _, _, kh, kw, _, _ = kernel.shape
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    padded = topi.nn.pad(data, [0, 0, pt, pl, 0], [0, 0, pb, pr, 0], name="depthwise_pad")
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    return te.compute((n, cb, oh, ow, c), lambda b, o, y, x, i: te.sum(
        padded[b, o, y * sh + ry * dh, x * sw + rx * dw, i].astype(out_dtype) * kernel[o, 0, ry, rx, 0, i].astype(out_dtype),
        axis=[ry, rx]), name="depthwise_conv2d_NCHWc")


def _conv2d(bb, call):
    a = call.attrs
    out_dtype = str(a.out_dtype) if str(a.out_dtype) not in ("", "void", "None") else str(call.ty.dtype)
    blocked = a.data_layout not in ("NCHW", "NHWC")
    if blocked and int(a.groups) != 1 and str(a.kernel_layout).startswith("OIHW1i"):
        return bb.call_te(depthwise_conv2d_nchwc, call.args[0], call.args[1], [int(x) for x in a.strides], [int(x) for x in a.padding],
                          [int(x) for x in a.dilation], out_dtype, primfunc_name_hint="depthwise_conv2d_NCHWc")
    if not blocked or int(a.groups) != 1:
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
    return bb.call_te(topi.nn.conv2d_NCHWc, call.args[0], call.args[1], [int(x) for x in a.strides],
                      [int(x) for x in a.padding], [int(x) for x in a.dilation], a.data_layout, a.out_layout, out_dtype,
                      primfunc_name_hint="conv2d_NCHWc")


LEGALIZE = {"relax.nn.conv2d": _conv2d}
