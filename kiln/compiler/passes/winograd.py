"""Winograd: 3x3 stride-1 convolutions in NCHW{c}c (float32, any batch, padding 1) become Winograd
F(4x4, 3x3) kernels (F(2x2, 3x3) for outputs under 16x16, winograd.MIN_F4): 2.25-4x fewer
multiplies for the convs that hold most of a ResNet's work. The weights are transformed here,
once, at compile time; FuseEpilogue then fuses bias, activation and residual into the kernel
like a direct conv's. Results differ from a direct conv by rounding (within 3e-6 relative, measured).
Under `--precision bf16|fp16` (MixedPrecision runs first) it also takes the reduced-precision convs
whose data is a float32 tensor cast for them (directly or through a layout transform): the kernel
reads the float32 tensor itself (no cast kernel, activations unrounded) and the
transformed weights are stored in the reduced type (half the bytes to stream). `min_reduced_tile`
4 (the pipeline's choice where bf16 convs have the vdpbf16ps kernel): only F(4x4) then. F(2x2)
multiplies 2.25x less than a direct conv, but vdpbf16ps does twice the float32 rate and its weights
are 1.8x smaller, so on ResNet-50 bf16 the F(2x2) convs ran faster on vdpbf16ps (benchmarks/history.md).
`stats["winograd_convs"]` counts the convs it took; `--disable-pass Winograd` keeps direct convs."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import register_kernel
from ..winograd import conv2d_winograd_nchwc, tile_size, transform_weight
from .counting import REDUCED_TYPES, bound_call, float32_conv, nchwc_block
from .module_map import rewrite_calls

PRIMFUNC = register_kernel("winograd_conv2d", "nn.conv2d_winograd", convs=1)  # FuseEpilogue anchors on it
REDUCED = dict(REDUCED_TYPES.values())  # MixedPrecision's operand types, by TVM name


# F(2x2) on a map of at most this many tiles (8x8) with fewer output channels than this stays direct: DenseNet-121's
# 3x3 convs, 128 -> 32 channels, ran faster direct at 7x7 and 3x3, and on Winograd at 14x14 (49 tiles); ResNet's
# 7x7 convs have 512 outputs (timings in benchmarks/history.md)
SMALL_GEMM_TILES = 16
SMALL_GEMM_OUTPUTS = 64


def geometry(attrs, kernel: list[int]) -> bool:
    """A 3x3 kernel, stride 1, dilation 1, padding 1: the convs Winograd computes (in any layout)."""
    return (
        list(kernel) == [3, 3]
        and [int(s) for s in attrs.strides] == [1, 1]
        and [int(d) for d in attrs.dilation] == [1, 1]
        and [int(p) for p in attrs.padding] == [1, 1, 1, 1]
    )


def applies(call, reduced: bool = False, small_direct: bool = False) -> int | None:
    """The output tile size for this conv2d call, or None when Winograd does not apply. `reduced`:
    the call is a MixedPrecision conv whose data has a float32 source (float32_source). small_direct: every F(2x2)
    conv on at most SMALL_GEMM_TILES tiles stays direct (a target with the fp32 conv kernel: ResNet-50's 512-channel
    7x7 convs ran 1.7x faster on it than as F(2x2); benchmarks/history.md)."""
    if (not reduced and not float32_conv(call)) or int(call.attrs.groups) != 1:
        return None
    a, x, w = call.attrs, call.args[0].ty, call.args[1]
    c = nchwc_block(str(a.data_layout))
    if c is None or str(a.out_layout) != str(a.data_layout):
        return None
    shp, wshp = [int(v) for v in x.shape.values], list(w.value.shape)
    if len(wshp) != 6 or wshp[4:] != [c, c] or str(a.kernel_layout) != f"OIHW{c}i{c}o" or not geometry(a, wshp[2:4]):
        return None
    m = tile_size(shp[2], shp[3]) if min(shp[2], shp[3]) >= 2 else None
    small = m == 2 and -(-shp[2] // 2) * -(-shp[3] // 2) <= SMALL_GEMM_TILES
    if small and (small_direct or wshp[0] * c < SMALL_GEMM_OUTPUTS):
        return None  # GEMMs of at most 16 rows by a few output blocks: the direct conv is faster
    return m


def float32_source(call, lookup_binding):
    """For a MixedPrecision conv (reduced-precision data and weights, float32 out): the float32
    tensor its data was cast from, and the layout transform between the two (or None), if any."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.nn.conv2d":
        return None
    x, w = call.args[0], call.args[1]
    if not (
        isinstance(w, GenericConst)
        and str(x.ty.dtype) in REDUCED
        and str(w.ty.dtype) == str(x.ty.dtype)
        and str(call.attrs.out_dtype) == "float32"
    ):
        return None
    relayout = bound_call(x, lookup_binding, "relax.layout_transform")  # e.g. after a stem left in NCHW
    cast = bound_call(relayout.args[0] if relayout is not None else x, lookup_binding, "relax.astype")
    if cast is None or str(cast.args[0].ty.dtype) != "float32":
        return None
    return cast.args[0], relayout


def _to_winograd(builder, call, lookup_binding, min_reduced_tile: int, small_direct: bool):
    source = float32_source(call, lookup_binding)
    m = applies(call, reduced=source is not None, small_direct=small_direct and source is None)
    if m is None or (source is not None and m < min_reduced_tile):
        return None
    data, dtype = call.args[0], "float32"
    if source is not None:
        data, relayout = source
        if relayout is not None:
            data = builder.emit(relax.Call(relayout.op, [data], relayout.attrs))
        dtype = str(call.args[1].ty.dtype)
    u = transform_weight(call.args[1].value.numpy().astype("float32"), m).astype(REDUCED.get(dtype, np.float32))
    return builder.call_te(conv2d_winograd_nchwc, data, relax.const(u, dtype), m, primfunc_name_hint=PRIMFUNC)


# what Winograd counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("winograd_convs", int, "3x3 stride-1 convs as Winograd kernels", always=True),)


@tvm.transform.module_pass(opt_level=2, name="Winograd")
class Winograd:
    COUNTERS = COUNTERS

    def __init__(self, min_reduced_tile: int = 2, small_direct: bool = False):
        self.min_reduced_tile = min_reduced_tile
        self.small_direct = small_direct
        self.stats = {"winograd_convs": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(
            mod,
            lambda b, call, lookup: _to_winograd(b, call, lookup, self.min_reduced_tile, self.small_direct),
            lookup=True,
        )
        self.stats["winograd_convs"] += count
        return out
