"""PatchConvAsMatmul: a patch-embedding conv (kernel equal to its stride, no padding: ViT's 16x16/16, CLIP's
32x32/32 or 14x14/14, 3 -> 768 channels) as one matmul, its patches gathered into rows [N * patches, C * kh *
kw] (a plain reshape and permute: the patches do not overlap) times the weights as [C * kh * kw, O], then the
rows permuted back to NCHW.

No conv schedule suits it: the stride is past what the conv kernels take (F32ConvKernel: 1 and 2) and TVM's
default NCHWc schedule ran CLIP ViT-B/32's 3 -> 768 stem at 19% of the FMA peak, 2.7 ms of its 44 ms (ViT-B/16's
at 30%, 1.6 ms); as a matmul it is one GEMM of 49 or 196 rows by K = 3072 or 768 on the matmul kernels (fp32,
bf16 and AMX, with their packed weights and fused bias), timings in benchmarks/history.md. The gather and the
permute back are copies of the input and the output (600 KB each), which TVM fuses with their neighbours (ViT's
flatten and transpose after the conv). Only float convs of groups 1 and dilation 1 with constant weights, static
shapes and patches at least MIN_PATCH wide and high are rewritten (smaller strided kernels, ConvNeXt's and Swin's
4x4 stems, stay convs: their maps are large and their next op a conv that wants the blocked layout); a map not a
multiple of the patch is cropped first, as the conv drops the rest.

A 1x1 conv (kernel 1 = stride 1) whose output channels no block divides (SqueezeNet's 1000-class head, YOLO's
255-channel heads) is the same matmul: its NCHW output kept it off the blocked conv kernels, on TVM's generic NCHW
schedule at 30% of the peak (SqueezeNet 1.1's head 1.43 ms of its 4.3), where the matmul kernel pads its columns to
the block. At least MIN_HEAD channels: a few-class head costs little either way, and MobileNetV3's 120-200-channel
pointwise convs ran slower as matmuls between transposes than blocked by 8 (its corpus models 1.2-1.3x).
`stats["patch_conv_as_matmul"]` counts both."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import ints, op_name, out_dtype
from .counting import static_shape
from .module_map import rewrite_calls

MIN_PATCH = 8  # patch side: ViT-family patch embeddings (14, 16, 32); 4x4 stems stay convs
BLOCK = 16  # the conv kernels' output-channel block (NCHW16c)
MIN_HEAD = 256  # 1x1 convs of at least this many output channels no BLOCK divides are matmuls too


def _patch_conv(call) -> tuple | None:
    """(x shape, weights) of a conv PatchConvAsMatmul takes, else None."""
    if op_name(call) != "relax.nn.conv2d":
        return None
    a = call.attrs
    x, w = call.args
    xs = static_shape(x)
    if (
        a.data_layout != "NCHW"
        or a.kernel_layout != "OIHW"
        or a.out_layout != "NCHW"
        or int(a.groups) != 1
        or ints(a.dilation) != [1, 1]
        or any(ints(a.padding))
        or not isinstance(w, GenericConst)
        or xs is None
        or len(xs) != 4
        or str(x.ty.dtype) not in ("float32", "float16", "bfloat16")
        or out_dtype(a) not in (None, str(x.ty.dtype))
    ):
        return None
    o, _, kh, kw = w.value.shape
    if ints(a.strides) != [kh, kw] or xs[2] < kh or xs[3] < kw:
        return None
    pointwise_head = (kh, kw) == (1, 1) and o >= MIN_HEAD and o % BLOCK
    if min(kh, kw) < MIN_PATCH and not pointwise_head:
        return None
    return xs, w.value.numpy()


def _rewrite(builder, call):
    found = _patch_conv(call)
    if found is None:
        return None
    (n, c, h, w), weights = found
    o, _, kh, kw = weights.shape
    ho, wo = h // kh, w // kw
    x = call.args[0]
    if (ho * kh, wo * kw) != (h, w):  # the conv never reads the last rows or columns
        x = builder.emit(relax.op.strided_slice(x, axes=[2, 3], begin=[0, 0], end=[ho * kh, wo * kw]))
    patches = relax.op.permute_dims(relax.op.reshape(x, [n, c, ho, kh, wo, kw]), [0, 2, 4, 1, 3, 5])
    rows = builder.emit(relax.op.reshape(patches, [n * ho * wo, c * kh * kw]))
    wt = relax.const(weights.reshape(o, c * kh * kw).T.copy())
    y = builder.emit(relax.op.matmul(rows, wt))  # [N * patches, O]
    return relax.op.permute_dims(relax.op.reshape(y, [n, ho, wo, o]), [0, 3, 1, 2])


# what PatchConvAsMatmul counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("patch_conv_as_matmul", int, "patch-embedding convs run as matmul"),)


@tvm.transform.module_pass(opt_level=2, name="PatchConvAsMatmul")
class PatchConvAsMatmul:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"patch_conv_as_matmul": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(mod, _rewrite)
        self.stats["patch_conv_as_matmul"] += count
        return out
