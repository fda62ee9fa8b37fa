"""DropDeadConvTaps: stop a conv from multiplying its zero padding, where that is most of its work.

A dilated conv on a feature map not much larger than its dilation reads, through most of its taps,
nothing but padding: DeepLabV3's ASPP runs 3x3 convs with dilations 12, 24 and 36 on a 14x14 map (224
input). onnxruntime's NCHWc conv skips out-of-bounds taps per output pixel; a padded conv cannot, so:

1. **Dead taps** (taps that read padding for every output pixel) are cut from the weights. Per axis,
   tap k reads input position o*stride + k*dilation - pad_begin for output o; the live taps are a
   contiguous range [k0, k1], so the weights are sliced to it and the padding shifted (pad_begin -
   k0*dilation before, pad_end - (K-1-k1)*dilation after: the output size is kept). An axis left with
   one tap gets dilation 1. ASPP's dilation-24 and -36 convs become 1x1 convs (9x fewer multiply-adds,
   and no 86x86 padded copy of the input). Any conv1d/conv2d/conv3d; `stats["conv_taps_dropped"]`.
2. **Border bands** (conv2d only): where the taps left are live only for the output rows/columns near
   the borders, the output is cut, per axis, into bands of outputs that read the same taps (for
   dilation 12 on 14 rows: rows 0-1 read taps 1-2, rows 2-11 tap 1, rows 12-13 taps 0-1). Each pair
   of bands is an unpadded conv of the input slice it reads with those taps only, and the pieces are
   concatenated. Done when it at least halves the multiply-adds, with at most MAX_PIECES pieces: the
   dilation-12 conv does 18% of them. `stats["conv_band_split"]`.

Both are exact (what is left out multiplied zeros). Only convs with constant weights, NC* / OI* layouts
and static shapes are taken, and only where the new padding stays non-negative."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import op_name, out_dtype
from .counting import static_shape
from .module_map import rewrite_functions

CONVS = {"relax.nn.conv1d": ("NCW", "OIW"), "relax.nn.conv2d": ("NCHW", "OIHW"), "relax.nn.conv3d": ("NCDHW", "OIDHW")}
MAKE = {1: relax.op.nn.conv1d, 2: relax.op.nn.conv2d, 3: relax.op.nn.conv3d}
MAX_PIECES = 9  # band-split pieces of one conv (3 bands per axis: a dilated 3x3 conv)
MIN_SAVING = 2.0  # band-split only when it divides the multiply-adds by at least this
MIN_SAVED_MACS = 4e6  # and saves at least this many (~10 us): fewer does not pay for the extra kernels


def _out_size(size: int, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int) -> int:
    return (size + pad_begin + pad_end - dilation * (kernel - 1) - 1) // stride + 1


def live_taps(size: int, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int) -> tuple[int, int]:
    """First and last tap (inclusive) of one axis that read an input position for some output position;
    (0, -1) when none does."""
    out = _out_size(size, kernel, stride, dilation, pad_begin, pad_end)
    live = [
        k for k in range(kernel) if k * dilation - pad_begin < size and (out - 1) * stride + k * dilation >= pad_begin
    ]
    return (live[0], live[-1]) if live else (0, -1)


def bands(size: int, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int) -> list | None:
    """Runs of output positions of one axis that read the same taps: [(o0, o1, k0, k1)] (outputs o0..o1-1,
    taps k0..k1, all inside the input for every output of the run); None if an output reads no tap."""
    out = _out_size(size, kernel, stride, dilation, pad_begin, pad_end)
    runs: list = []
    for o in range(out):
        live = [k for k in range(kernel) if 0 <= o * stride + k * dilation - pad_begin < size]
        if not live:
            return None
        if runs and runs[-1][2:] == (live[0], live[-1]):
            runs[-1] = (runs[-1][0], o + 1, live[0], live[-1])
        else:
            runs.append((o, o + 1, live[0], live[-1]))
    return runs


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.cut = self.split = 0

    def _conv(self, call):
        a = call.attrs
        x, w = call.args
        layouts = CONVS[call.op.name]
        xs = static_shape(x)
        if (a.data_layout, a.kernel_layout) != layouts or a.out_layout != layouts[0] or xs is None:
            return None
        if not isinstance(w, GenericConst):
            return None
        wv = w.value.numpy()
        rank = wv.ndim - 2
        pads = [int(p) for p in a.padding]
        strides, dilation = [int(s) for s in a.strides], [int(d) for d in a.dilation]
        begin, end = pads[:rank], pads[rank:]
        ks, cut = wv.shape[2:], False
        taps = [live_taps(xs[2 + i], ks[i], strides[i], dilation[i], begin[i], end[i]) for i in range(rank)]
        if any(k1 < k0 for k0, k1 in taps):
            return None  # nothing live: the output is the bias; left as it is
        if any(k1 - k0 + 1 < ks[i] for i, (k0, k1) in enumerate(taps)):
            new_begin = [begin[i] - k0 * dilation[i] for i, (k0, _) in enumerate(taps)]
            new_end = [end[i] - (ks[i] - 1 - k1) * dilation[i] for i, (_, k1) in enumerate(taps)]
            if min(new_begin + new_end) >= 0:
                wv = np.ascontiguousarray(wv[(slice(None), slice(None)) + tuple(slice(k0, k1 + 1) for k0, k1 in taps)])
                dilation = [1 if k1 == k0 else dilation[i] for i, (k0, k1) in enumerate(taps)]
                begin, end, ks = new_begin, new_end, wv.shape[2:]
                call = MAKE[rank](
                    x,
                    relax.const(wv),
                    strides=strides,
                    padding=begin + end,
                    dilation=dilation,
                    groups=int(a.groups),
                    data_layout=a.data_layout,
                    kernel_layout=a.kernel_layout,
                    out_layout=a.out_layout,
                    out_dtype=out_dtype(a),
                )
                self.cut, cut = self.cut + 1, True
        if rank == 2:
            split = self._band_split(call, x, xs, wv, strides, dilation, begin, end)
            if split is not None:
                return split
        return call if cut else None

    def _band_split(self, call, x, xs, wv, strides, dilation, begin, end):
        ks = wv.shape[2:]
        runs = [bands(xs[2 + i], ks[i], strides[i], dilation[i], begin[i], end[i]) for i in range(2)]
        if any(r is None for r in runs) or len(runs[0]) * len(runs[1]) > MAX_PIECES:
            return None
        macs = [sum((o1 - o0) * (k1 - k0 + 1) for o0, o1, k0, k1 in r) for r in runs]
        full = [len_out * ks[i] for i, len_out in enumerate(r[-1][1] for r in runs)]
        per_tap = wv.shape[0] * wv.shape[1] * xs[0]  # multiply-adds of one tap at one output pixel
        saved = (full[0] * full[1] - macs[0] * macs[1]) * per_tap
        if macs[0] * macs[1] * MIN_SAVING > full[0] * full[1] or saved < MIN_SAVED_MACS:
            return None
        a = call.attrs
        rows = []
        for h0, h1, hk0, hk1 in runs[0]:
            pieces = []
            for w0, w1, wk0, wk1 in runs[1]:
                lo = [
                    o0 * strides[i] + k0 * dilation[i] - begin[i] for i, (o0, k0) in enumerate(((h0, hk0), (w0, wk0)))
                ]
                hi = [
                    (o1 - 1) * strides[i] + k1 * dilation[i] - begin[i] + 1
                    for i, (o1, k1) in enumerate(((h1, hk1), (w1, wk1)))
                ]
                piece = self.builder_.emit(relax.op.strided_slice(x, axes=[2, 3], begin=lo, end=hi))
                wp = np.ascontiguousarray(wv[:, :, hk0 : hk1 + 1, wk0 : wk1 + 1])
                conv = relax.op.nn.conv2d(
                    piece,
                    relax.const(wp),
                    strides=strides,
                    padding=[0, 0, 0, 0],
                    dilation=[1 if hk0 == hk1 else dilation[0], 1 if wk0 == wk1 else dilation[1]],
                    groups=int(a.groups),
                    out_dtype=out_dtype(a),
                )
                pieces.append(self.builder_.emit(conv))
            rows.append(pieces[0] if len(pieces) == 1 else self.builder_.emit(relax.op.concat(pieces, axis=3)))
        self.split += 1
        return rows[0] if len(rows) == 1 else relax.op.concat(rows, axis=2)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if op_name(call) in CONVS:
            new = self._conv(call)
            return call if new is None else new
        return call


# what DropDeadConvTaps counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("conv_band_split", int, "convs split into border bands"),
    Counter("conv_taps_dropped", int, "convs whose padding-only taps were cut"),
)


@tvm.transform.module_pass(opt_level=1, name="DropDeadConvTaps")
class DropDeadConvTaps:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"conv_taps_dropped": 0, "conv_band_split": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        def rewrite(f):
            rw = _Rewriter(mod)
            out = rw.visit_expr(f)
            self.stats["conv_taps_dropped"] += rw.cut
            self.stats["conv_band_split"] += rw.split
            return out

        return rewrite_functions(mod, rewrite)
