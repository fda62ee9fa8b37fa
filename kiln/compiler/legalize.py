"""Kiln's legalizations that TVM's defaults lack: conv2d in a blocked NCHW{n}c layout lowers to
topi's conv2d_NCHWc (TVM's default legalization skips blocked layouts and the build fails).
Everything else falls through to TVM's registered legalizer."""
from __future__ import annotations

import tvm
from tvm import topi


def _conv2d(bb, call):
    a = call.attrs
    if a.data_layout == "NCHW" or a.data_layout == "NHWC" or int(a.groups) != 1:
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
    out_dtype = str(a.out_dtype) if str(a.out_dtype) not in ("", "void", "None") else str(call.ty.dtype)
    return bb.call_te(topi.nn.conv2d_NCHWc, call.args[0], call.args[1], [int(x) for x in a.strides],
                      [int(x) for x in a.padding], [int(x) for x in a.dilation], a.data_layout, a.out_layout, out_dtype,
                      primfunc_name_hint="conv2d_NCHWc")


LEGALIZE = {"relax.nn.conv2d": _conv2d}
