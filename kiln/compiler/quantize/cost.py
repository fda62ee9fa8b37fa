"""A layer's cost in float32 multiply-add equivalents, float32 against int8 on the target's int8
kernel, and whether int8 pays for it (speed.py sums these over a model; layers.py keeps a layer
float when it does not). Imports neither, so both can use it.

The model: multiply-adds at the kernel's peak int8/float32 rate (Int8Kernel.speedup), plus memory
passes priced per byte: the weights (4 bytes in float32, 1 in int8: what makes a batch-1 matmul
pay) and, for int8, quantizing the input to uint8 (read 4 bytes, write 1) wherever it cannot fuse
into its producer."""

from __future__ import annotations

import math

# float32 multiply-add equivalents per byte moved by a memory-bound pass. With it a 1x1 conv on a 4x
# kernel pays from about 32 output channels; MobileNetV2's 144->24 projections (int8 measured slower
# on Zen 5) stay float.
BYTE_COST = 4.8
INPUT_COST = 5 * BYTE_COST  # per input element quantized: read 4 bytes, write 1


def layer_cost(call) -> tuple[int, int, int]:
    """(multiply-adds, input elements, weight elements) of a conv2d (NCHW/OIHW) or matmul call."""
    x, w, y = (math.prod(int(d) for d in t.shape) for t in (call.args[0].ty, call.args[1].ty, call.ty))
    if call.op.name == "relax.nn.conv2d":
        per_output = w // int(call.args[1].ty.shape[0])  # I/groups * KH * KW
    else:
        per_output = int(call.args[1].ty.shape[0])  # K
    return y * per_output, x, w


def estimates(cost: tuple[int, int, int], kernel) -> tuple[float, float]:
    """(float32, int8) estimates of a layer_cost on `kernel`, in float32 multiply-add equivalents."""
    macs, x, w = cost
    return macs + 4 * BYTE_COST * w, macs / kernel.speedup + BYTE_COST * w + INPUT_COST * x


def slower_reason(call, kernel) -> str | None:
    """Why int8 would not be faster for this layer on `kernel` (None: it would be)."""
    cost = layer_cost(call)
    fp32, int8 = estimates(cost, kernel)
    if int8 < fp32:
        return None
    return (
        f"int8 would not be faster here: {cost[0]} multiply-adds for {cost[1]} input elements to quantize "
        f"({kernel.path} runs about {kernel.speedup:g}x float32's rate; estimates int8 {int8:.3g}, float32 {fp32:.3g})"
    )
