"""F32ConvKernel: float32 convolutions in NCHW16c on Kiln's AVX-512 C kernel (kiln/schedules/kernels/f32_conv.c:
tiles of up to 14 pixels x 2 blocks of 16 output channels in 28 zmm accumulators, vfmadd231ps with broadcast
inputs, the OIHW16i16o weights as they are). TVM 0.27's default x86 conv schedule ran ResNet-50's convs at 25-47%
of the FMA peak on Sapphire Rapids, where the kernel runs them at 58-80% (benchmarks/history.md). Each conv2d
becomes a call_tir to a PrimFunc calling the kernel per output row and task, as BF16ConvKernel's vdpbf16ps
kernel (bf16_conv_kernel.kernel_func with dtype float32: same tasks, same epilogue), so FuseBF16Epilogue moves the
bias, residual, GELU and ReLU/ReLU6 that follow into it. It takes the convs Winograd did not take (Winograd leaves
F(2x2) convs on maps of at most 8x8 to it), groups 1, any dilation (segmentation nets' dilated stages), strides 1
or 2 along the width, batch 1.
`stats["f32_kernel_convs"]` counts them."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter
from .bf16_conv_kernel import C_KERNELS, EXTERNS, kernel_func
from .counting import float32_conv, static_shape
from .module_map import rewrite_calls

BLOCK = 16  # channels per block of data, weights and outputs (one zmm of float32)


def applies(call) -> bool:
    """A float32 conv2d the kernel computes: NCHW16c data of one image, OIHW16i16o constant weights, groups 1,
    stride 1 or 2 along the width (the tile functions' compile-time strides), any dilation."""
    if not float32_conv(call):
        return False
    a = call.attrs
    shp, wshp = static_shape(call.args[0]), static_shape(call.args[1])
    return (
        shp is not None
        and wshp is not None
        and len(shp) == 5
        and shp[0] == 1
        and shp[4] == BLOCK
        and len(wshp) == 6
        and wshp[4:] == (BLOCK, BLOCK)
        and str(a.data_layout) == f"NCHW{BLOCK}c"
        and str(a.kernel_layout) == f"OIHW{BLOCK}i{BLOCK}o"
        and str(a.out_layout) == f"NCHW{BLOCK}c"
        and int(a.groups) == 1
        and int(a.strides[1]) in (1, 2)
    )


def _to_kernel(builder, call):
    if not applies(call):
        return None
    a, w = call.attrs, call.args[1]
    wshp = static_shape(w)
    func, out_shape = kernel_func(
        static_shape(call.args[0]),
        wshp[0],
        wshp[2:4],
        [int(s) for s in a.strides],
        [int(p) for p in a.padding],
        dtype="float32",
        dilation=tuple(int(d) for d in a.dilation),
    )
    gv = builder.add_func(func.without_attr("global_symbol"), EXTERNS["float32"])  # TVMScript names it "func"
    return relax.call_tir(gv, [call.args[0], w], relax.TensorType(list(out_shape), "float32"))


# what F32ConvKernel counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("f32_kernel_convs", int, "float32 convs on Kiln's AVX-512 conv kernel", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="F32ConvKernel")
class F32ConvKernel:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"f32_kernel_convs": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(mod, _to_kernel)
        if not count:
            return mod
        from ...schedules.kernels import build

        build(C_KERNELS["float32", False][1])  # compiled and loaded before anything references its symbol
        self.stats["f32_kernel_convs"] += count
        return relax.transform.DeadCodeElimination(["main"])(out)
