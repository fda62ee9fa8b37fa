"""Which default schedule rule a kernel gets: a table keyed by (target family, kernel kind).
The kind comes from the kernel's blocks: its largest reduction block's name, or "injective"."""

from __future__ import annotations

from collections.abc import Callable

from tvm import s_tir

from . import int8, rules
from .dwpw import depthwise_pointwise
from .winograd import winograd_nchwc

RULES: dict[tuple[str, str], Callable] = {
    ("cpu", "conv2d"): rules.reduction_tiled,
    ("cpu", "conv2d_nchw"): rules.conv_nchw_pointwise,
    ("cpu", "conv2d_nchw_oc"): rules.conv_nchw_oc_vectorized,
    ("cpu", "depthwise_nchw"): rules.depthwise_nchw,
    ("cpu", "conv2d_int8"): int8.conv2d_int8,
    ("cpu", "matmul_int8"): int8.matmul_int8,
    ("cpu", "matmul"): rules.reduction_tiled,
    ("cpu", "pool"): rules.reduction_tiled,
    ("cpu", "reduction"): rules.reduction_tiled,
    ("cpu", "multi_reduction"): rules.rowwise,
    ("cpu", "softmax"): rules.softmax_rows,
    ("cpu", "injective"): rules.injective,
    ("cpu", "layout_transform"): rules.layout_transform_tiled,
    ("cpu", "winograd"): winograd_nchwc,
    ("cpu", "depthwise_pointwise"): depthwise_pointwise,
}
# when a kind's rule does not apply (e.g. output channels not divisible by the lanes), try these
FALLBACK = {
    "softmax": ("multi_reduction",),
    "conv2d_nchw": ("conv2d_nchw_oc", "conv2d"),
    "depthwise_nchw": ("reduction",),
    "conv2d_int8": ("conv2d",),
    "matmul_int8": ("matmul",),
    "layout_transform": ("injective",),
}
KIND_BY_BLOCK_PREFIX = (
    ("winograd_gemm", "winograd"),
    ("conv2d_NCHWc_int8", "conv2d_int8"),
    ("matmul_int8", "matmul_int8"),
    ("conv2d_nchw", "conv2d_nchw"),
    ("group_conv2d_nchw", "depthwise_nchw"),
    ("conv2d", "conv2d"),
    ("depthwise", "conv2d"),
    ("matmul", "matmul"),
    ("T_matmul", "matmul"),
    ("dense", "matmul"),
    ("pool", "pool"),
    ("adaptive_pool", "pool"),
)


def classify(sch: s_tir.Schedule):
    """(kind, anchor block) of a kernel; kind None when no rule applies (left to TVM's default)."""
    blocks = rules.blocks(sch)
    red = [b for b in blocks if rules.COMM_REDUCE in rules.iter_types(sch, b)]
    if not red:
        if len(blocks) == 1 and sch.get(blocks[0]).name_hint.startswith("te_layout_transform"):
            return "layout_transform", blocks[0]
        return "injective", None
    if len(red) > 1:
        pointwise = [b for b in red if sch.get(b).name_hint == "dwpw_pointwise"]
        if pointwise:
            return "depthwise_pointwise", pointwise[0]
        if any(sch.get(b).name_hint.startswith("softmax_norm") for b in blocks):
            return "softmax", None
        return "multi_reduction", None  # layer norm, ...
    name = sch.get(red[0]).name_hint
    for prefix, kind in KIND_BY_BLOCK_PREFIX:
        if name.startswith(prefix):
            return kind, red[0]
    return "reduction", red[0]


def target_family(target) -> str:
    return "cpu" if target.kind.name == "llvm" else target.kind.name
