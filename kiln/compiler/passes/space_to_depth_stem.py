"""SpaceToDepthStem: a stride-2 conv on a few input channels (an image stem: ResNet's 7x7 on RGB) as a stride-1
conv on the input's 2x2 space-to-depth blocks, its channels padded to the bf16 conv kernels' block of 16.

A 3-channel conv has no 16-channel block, so in a bf16 build it stayed float32 on TVM's schedule: ResNet-50's
stem took 0.84 ms of a 10 ms bf16 run on an AMX host. Rearranged, each 2x2 block of input pixels is one pixel of
4 x C channels (12 for RGB, zero-padded to 16), the 7x7 stride-2 kernel a 4x4 stride-1 kernel on them (taps past
the original kernel are zero), and the conv runs on the bf16 kernel (BF16ConvKernel) like the rest of the net.
The input is padded (the conv's own padding, then zeros up to whole blocks), split into blocks and padded in
channels by a few injective ops that fuse with the layout transform and the bf16 cast.

Exact (the same products; the added ones are by zeros). Taken: conv2d in NCHW/OIHW (before ConvertLayout) with
batch 1, stride 2 both ways, no dilation, groups 1, 4 input channels or fewer, a kernel above 2x2 and constant
weights: float ones in builds whose float stem then runs on a faster kernel (bf16 on the bf16 conv kernel,
--quantize int8; backends/cpu.py), integer ones (a QDQ model's, after LowerQDQ: its input's zero point is padded
explicitly, so the blocks' zeros only meet zero weights) wherever the target has an int8 kernel.
`stats["space_to_depth_stems"]`."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import op_name, out_dtype
from .counting import static_shape
from .module_map import rewrite_calls

BLOCK = 16  # the bf16 conv kernels' channel block (NCHW16c): the blocked input's channels are padded to it


def _taken(call, float_convs: bool) -> bool:
    if op_name(call) != "relax.nn.conv2d" or not isinstance(call.args[1], GenericConst):
        return False
    a = call.attrs
    xs, ws = static_shape(call.args[0]), static_shape(call.args[1])
    integer = str(call.args[0].ty.dtype) in ("uint8", "int8")  # a QDQ model's int8 stem, its zero point padded
    return (
        (integer or float_convs)
        and xs is not None
        and len(xs) == 4
        and xs[0] == 1
        and (a.data_layout, a.kernel_layout, a.out_layout) == ("NCHW", "OIHW", "NCHW")
        and all(int(d) == 1 for d in a.dilation)
        and int(a.groups) == 1
        and rearranged(xs[1], [int(s) for s in a.strides], ws[2:])
    )


def rearranged(channels: int, strides, kernel) -> bool:
    """Whether a conv of this geometry is a stem this pass rearranges (with batch 1, groups 1, no dilation and
    constant weights): stride 2 both ways, its 2x2 blocks' channels within one block, a kernel above 2x2."""
    return 4 * channels <= BLOCK and list(strides) == [2, 2] and min(kernel) > 2


def blocked_shape(o: int, kh: int, kw: int) -> tuple[int, int, int, int]:
    """The shape of blocked_weights' result for [O, C, KH, KW] weights."""
    return o, BLOCK, -(-kh // 2), -(-kw // 2)


def blocked_weights(w: np.ndarray) -> np.ndarray:
    """[O, C, KH, KW] stride-2 weights -> [O, 16, ceil(KH/2), ceil(KW/2)] on 2x2 blocks: input channel
    c * 4 + dy * 2 + dx at tap (ky, kx) is w[o, c, 2 ky + dy, 2 kx + dx], zero past the kernel and past 4 C."""
    o, c, kh, kw = w.shape
    padded = np.zeros((o, c, 2 * -(-kh // 2), 2 * -(-kw // 2)), w.dtype)
    padded[:, :, :kh, :kw] = w
    blocks = padded.reshape(o, c, -(-kh // 2), 2, -(-kw // 2), 2).transpose(0, 1, 3, 5, 2, 4)
    out = np.zeros(blocked_shape(o, kh, kw), w.dtype)
    out[:, : 4 * c] = blocks.reshape(o, 4 * c, *blocks.shape[4:])
    return out


def _rewrite(builder, call, float_convs: bool):
    if not _taken(call, float_convs):
        return None
    a = call.attrs
    x, w = call.args[0], call.args[1].value.numpy()
    _, c, h, wd = static_shape(x)
    pt, pl, pb, pr = (int(p) for p in a.padding)
    kh2, kw2 = -(-w.shape[2] // 2), -(-w.shape[3] // 2)
    oh, ow = (h + pt + pb - w.shape[2]) // 2 + 1, (wd + pl + pr - w.shape[3]) // 2 + 1
    hs, ws = 2 * (oh + kh2 - 1), 2 * (ow + kw2 - 1)  # the padded input the blocks cover
    if hs < h + pt or ws < wd + pl:  # padding past what the outputs read: rare, left as it is
        return None
    pad = [0, 0, 0, 0, pt, hs - h - pt, pl, ws - wd - pl]
    xp = builder.emit(relax.op.nn.pad(x, pad_width=pad))
    xr = builder.emit(relax.op.reshape(xp, [1, c, hs // 2, 2, ws // 2, 2]))
    xt = builder.emit(relax.op.permute_dims(xr, [0, 1, 3, 5, 2, 4]))
    xs = builder.emit(relax.op.reshape(xt, [1, 4 * c, hs // 2, ws // 2]))
    xb = builder.emit(relax.op.nn.pad(xs, pad_width=[0, 0, 0, BLOCK - 4 * c, 0, 0, 0, 0])) if 4 * c < BLOCK else xs
    return relax.op.nn.conv2d(
        xb,
        relax.const(blocked_weights(w), str(call.args[1].ty.dtype)),
        strides=[1, 1],
        padding=[0, 0, 0, 0],
        dilation=[1, 1],
        groups=1,
        data_layout="NCHW",
        kernel_layout="OIHW",
        out_layout="NCHW",
        out_dtype=out_dtype(a),
    )


# what SpaceToDepthStem counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("space_to_depth_stems", int, "stride-2 convs on few channels run on 2x2 space-to-depth blocks"),
)


@tvm.transform.module_pass(opt_level=1, name="SpaceToDepthStem")
class SpaceToDepthStem:
    COUNTERS = COUNTERS

    def __init__(self, float_convs: bool = True):
        self.float_convs = float_convs  # float stems too (bf16 and --quantize int8 builds), not only integer ones
        self.stats = {"space_to_depth_stems": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, n = rewrite_calls(mod, lambda b, call: _rewrite(b, call, self.float_convs))
        self.stats["space_to_depth_stems"] += n
        return out
