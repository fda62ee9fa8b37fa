"""SubsampleStridedPointwise: a strided 1x1 conv as a strided slice of its input, then a stride-1 1x1 conv.

A 1x1 conv with stride s (ResNet's downsample shortcuts: 1024 -> 2048 channels at stride 2) reads one
input pixel in s x s, and reads it once per output-channel block: the blocked conv walks the whole input
for every block of output channels. At stride 2 that input is 4x larger than what the conv uses (ResNet-50's
last one: 784 KB, past a Zen 3 core's 512 KB L2, for 196 KB used), so each pass streams it from L3, half
of every cache line wasted. Sliced first (one pass over the input, cheap), the conv reads a dense map that
stays in L2 and runs much nearer the FMA peak (timings in benchmarks/history.md).

Exact (the same products, in the same order). Taken: conv2d in NCHW/OIHW (before ConvertLayout) with a
1x1 kernel, no padding, a stride above 1 and a static input shape; any dtype (QDQ models' uint8 inputs
too) and any groups. `stats["strided_pointwise_subsampled"]`."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter
from ..ir import op_name, out_dtype
from .counting import static_shape
from .module_map import rewrite_calls


def _subsample(builder, call):
    if op_name(call) != "relax.nn.conv2d":
        return None
    a = call.attrs
    x, w = call.args
    xs, ws = static_shape(x), static_shape(w)
    if xs is None or ws is None or len(xs) != 4 or len(ws) != 4:
        return None
    if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW") or tuple(ws[2:]) != (1, 1):
        return None
    strides = [int(s) for s in a.strides]
    if max(strides) == 1 or any(int(p) for p in a.padding):
        return None
    sliced = builder.emit(relax.op.strided_slice(x, axes=[2, 3], begin=[0, 0], end=list(xs[2:]), strides=strides))
    return relax.op.nn.conv2d(
        sliced,
        w,
        strides=[1, 1],
        padding=[0, 0, 0, 0],
        dilation=[1, 1],
        groups=int(a.groups),
        data_layout="NCHW",
        kernel_layout="OIHW",
        out_layout="NCHW",
        out_dtype=out_dtype(a),
    )


# what SubsampleStridedPointwise counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("strided_pointwise_subsampled", int, "strided 1x1 convs on a subsampled input"),
)


@tvm.transform.module_pass(opt_level=1, name="SubsampleStridedPointwise")
class SubsampleStridedPointwise:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"strided_pointwise_subsampled": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, n = rewrite_calls(mod, _subsample)
        self.stats["strided_pointwise_subsampled"] += n
        return out
