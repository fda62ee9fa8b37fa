"""ConvTransposeAsConv: run a transposed conv2d as a conv2d with stride*stride times the output channels,
followed by depth-to-space (the sub-pixel decomposition), so it gets conv2d's blocked layout and schedule.

TVM legalizes conv2d_transpose to topi's conv2d_transpose_nchw: the input dilated with zeros, then a
direct conv over it, which multiplies those zeros (s*s times the work) and has no Kiln rule. PP-OCRv4's
detection head (DBNet: two ConvTranspose k=2 s=2) spent most of the model's time there (timings in
benchmarks/history.md).

Per axis, with o' = o + pad_begin = q*s + r (phase r), out'[q*s + r] = sum_m x[q - m] * W[r + m*s]: each
phase is a correlation of x with every s-th tap of W, M = ceil(K/s) taps (zero where r + m*s >= K). All
phases share one conv: padding M-1 on each side, M x M taps, output channel (co, rh, rw) carrying the
flipped taps of phase (rh, rw); then [N, Co*s*s, Q, Q] -> [N, Co, Q*s, Q*s] (reshape, permute,
reshape) and a crop to the transposed conv's output (pad_begin onwards). With K == s and no padding
(the usual 2x upsampling layer) that is a 1x1 conv and a depth-to-space. Only groups-1, dilation-1
NCHW/IOHW transposed convs with constant weights and static shapes are rewritten.
`stats["conv_transpose_as_conv"]` counts them."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import op_name, out_dtype
from .counting import static_shape
from .module_map import rewrite_calls


def phase_weights(w: np.ndarray, s: tuple[int, int]) -> np.ndarray:
    """IOHW transposed-conv weights [Ci, Co, KH, KW] -> OIHW conv weights [Co*sh*sw, Ci, MH, MW]:
    output channel co*sh*sw + rh*sw + rw, tap (th, tw) = W[:, co, rh + (MH-1-th)*sh, rw + (MW-1-tw)*sw]."""
    ci, co, kh, kw = w.shape
    (sh, sw), mh, mw = s, -(-kh // s[0]), -(-kw // s[1])
    padded = np.zeros((ci, co, mh * sh, mw * sw), w.dtype)
    padded[:, :, :kh, :kw] = w
    # tap index k = r + m*s  ->  [ci, co, m, r] per axis; then flip m (correlation)
    v = padded.reshape(ci, co, mh, sh, mw, sw)[:, :, ::-1, :, ::-1, :]
    return np.ascontiguousarray(v.transpose(1, 3, 5, 0, 2, 4).reshape(co * sh * sw, ci, mh, mw))


def _rewrite(builder, call):
    if op_name(call) != "relax.nn.conv2d_transpose":
        return None
    a = call.attrs
    x, w = call.args
    xs, out = static_shape(x), static_shape(call)
    if (
        (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "IOHW", "NCHW")
        or int(a.groups) != 1
        or any(int(d) != 1 for d in a.dilation)
        or not isinstance(w, GenericConst)
        or xs is None
        or out is None
    ):
        return None
    wv = w.value.numpy()
    s = tuple(int(v) for v in a.strides)
    pads = [int(p) for p in a.padding]  # top, left, bottom, right
    m = [-(-wv.shape[2 + i] // s[i]) for i in range(2)]
    q = [xs[2 + i] + m[i] - 1 for i in range(2)]  # the phase conv's output rows / columns
    if any(pads[i] + out[2 + i] > q[i] * s[i] for i in range(2)):
        return None  # output padding past what any tap reaches (zeros + bias): left to TVM
    co = wv.shape[1]
    conv = relax.op.nn.conv2d(
        x,
        relax.const(phase_weights(wv, s)),
        padding=[m[0] - 1, m[1] - 1, m[0] - 1, m[1] - 1],
        out_dtype=out_dtype(a),
    )
    y = builder.emit(conv)
    y = builder.emit(relax.op.reshape(y, (xs[0], co, s[0], s[1], q[0], q[1])))
    y = builder.emit(relax.op.permute_dims(y, [0, 1, 4, 2, 5, 3]))
    y = relax.op.reshape(y, (xs[0], co, q[0] * s[0], q[1] * s[1]))
    if (q[0] * s[0], q[1] * s[1]) != out[2:]:
        y = relax.op.strided_slice(
            builder.emit(y), axes=[2, 3], begin=pads[:2], end=[pads[i] + out[2 + i] for i in range(2)]
        )
    return y


# what ConvTransposeAsConv counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("conv_transpose_as_conv", int, "ConvTranspose ops as one conv2d and a depth-to-space"),
)


@tvm.transform.module_pass(opt_level=1, name="ConvTransposeAsConv")
class ConvTransposeAsConv:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"conv_transpose_as_conv": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(mod, _rewrite)
        self.stats["conv_transpose_as_conv"] += count
        return out
