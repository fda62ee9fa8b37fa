"""Winograd: 3x3 stride-1 convolutions in NCHW{c}c (float32, any batch, padding 1) become Winograd
F(4x4, 3x3) kernels (F(2x2, 3x3) for outputs under 16x16, winograd.MIN_F4): 2.25-4x fewer
multiplies for the convs that hold most of a ResNet's work. The weights are transformed here,
once, at compile time; FuseEpilogue then fuses bias, activation and residual into the kernel
like a direct conv's. Results differ from a direct conv by rounding (within 3e-6 relative, measured).
`stats["winograd_convs"]` counts the convs it took; `--disable-pass Winograd` keeps direct convs."""
from __future__ import annotations

import tvm
from tvm import relax

from ..winograd import conv2d_winograd_nchwc, tile_size, transform_weight
from .counting import float32_conv
from .module_map import rewrite_calls

PRIMFUNC = "winograd_conv2d"  # name hint of the kernels (FuseEpilogue anchors on it)


def applies(call) -> int | None:
    """The output tile size for this conv2d call, or None when Winograd does not apply."""
    if not float32_conv(call) or int(call.attrs.groups) != 1:
        return None
    a, x, w = call.attrs, call.args[0].ty, call.args[1]
    layout = str(a.data_layout)
    if not (layout.startswith("NCHW") and layout.endswith("c") and len(layout) > 5) or str(a.out_layout) != layout:
        return None
    shp, wshp = [int(v) for v in x.shape.values], list(w.value.shape)
    c = shp[4] if len(shp) == 5 else 0
    if (len(wshp) != 6 or wshp[2:] != [3, 3, c, c] or str(a.kernel_layout) != f"OIHW{c}i{c}o"
            or [int(s) for s in a.strides] != [1, 1]
            or [int(d) for d in a.dilation] != [1, 1] or [int(p) for p in a.padding] != [1, 1, 1, 1]):
        return None
    return tile_size(shp[2], shp[3]) if min(shp[2], shp[3]) >= 2 else None


def _to_winograd(builder, call):
    m = applies(call)
    if m is None:
        return None
    u = relax.const(transform_weight(call.args[1].value.numpy(), m), "float32")
    return builder.call_te(conv2d_winograd_nchwc, call.args[0], u, m, primfunc_name_hint=PRIMFUNC)


@tvm.transform.module_pass(opt_level=2, name="Winograd")
class Winograd:
    def __init__(self):
        self.stats = {"winograd_convs": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(mod, _to_winograd)
        self.stats["winograd_convs"] += count
        return out
