"""A layer's cost in float32 multiply-add equivalents, float32 against int8 on the target's int8
kernel, and whether int8 pays for it (speed.py sums these over a model; layers.py keeps a layer
float when it does not). Imports neither, so both can use it."""

from __future__ import annotations

import math

ELEMENT_OPS = 6  # vector ops per element: quantize an input (scale, round, zero point, clip, narrow), requantize


def layer_cost(call) -> tuple[int, int]:
    """(multiply-adds, elements quantized or requantized) of a conv2d (NCHW/OIHW) or matmul call."""
    x, w, y = (math.prod(int(d) for d in t.shape) for t in (call.args[0].ty, call.args[1].ty, call.ty))
    if call.op.name == "relax.nn.conv2d":
        per_output = w // int(call.args[1].ty.shape[0])  # I/groups * KH * KW
    else:
        per_output = int(call.args[1].ty.shape[0])  # K
    return y * per_output, x + y


def slower_reason(call, kernel) -> str | None:
    """Why int8 would not be faster for this layer on `kernel` (None: it would be)."""
    macs, elems = layer_cost(call)
    if macs / kernel.speedup + elems * ELEMENT_OPS < macs:
        return None
    return (
        f"int8 would not be faster here: {macs} multiply-adds over {elems} elements to quantize "
        f"({kernel.path} runs about {kernel.speedup:g}x float32's rate)"
    )
