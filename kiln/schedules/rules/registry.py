"""Which default schedule rule a kernel gets: a table keyed by (target family, kernel kind).
The kind is what the kernel's compute declares, or what its structure says (kinds.classify)."""

from __future__ import annotations

from collections.abc import Callable

from . import amx, int8, rules
from .conv3d import conv3d_oc_vectorized
from .depthwise import depthwise_nchw
from .dwpw import depthwise_pointwise
from .kinds import classify
from .matmul import matmul_tiled
from .pointwise import conv_nchw_pointwise
from .rows import row_reductions, softmax_rows
from .stem import conv2d_blocked
from .winograd import winograd_nchwc

RULES: dict[tuple[str, str], Callable] = {
    ("cpu", "conv2d"): conv2d_blocked,
    ("cpu", "conv2d_nchw"): conv_nchw_pointwise,
    ("cpu", "conv3d"): conv3d_oc_vectorized,
    ("cpu", "conv2d_nchw_oc"): rules.conv_nchw_oc_vectorized,
    ("cpu", "depthwise_nchw"): depthwise_nchw,
    ("cpu", "conv2d_int8"): int8.conv2d_int8,
    ("cpu", "conv2d_amx"): amx.conv2d_amx,
    ("cpu", "matmul_int8"): int8.matmul_int8,
    ("cpu", "matmul"): matmul_tiled,
    ("cpu", "pool"): rules.reduction_tiled,
    ("cpu", "reduction"): rules.reduction_tiled,
    ("cpu", "multi_reduction"): row_reductions,
    ("cpu", "softmax"): softmax_rows,
    ("cpu", "injective"): rules.injective,
    ("cpu", "layout_transform"): rules.layout_transform_tiled,
    ("cpu", "winograd"): winograd_nchwc,
    ("cpu", "depthwise_pointwise"): depthwise_pointwise,
}
# kinds whose rule sizes its register tile by the target's vector registers (a `registers=` keyword)
REGISTER_TILED = frozenset({"matmul", "conv3d", "conv2d", "conv2d_nchw", "winograd", "depthwise_pointwise"})
# when a kind's rule does not apply (e.g. output channels not divisible by the lanes), try these
FALLBACK = {
    "softmax": ("multi_reduction",),
    "conv3d": ("reduction",),
    "conv2d_nchw": ("conv2d_nchw_oc", "conv2d"),
    "depthwise_nchw": ("reduction",),
    "conv2d_int8": ("conv2d",),
    "conv2d_amx": ("reduction",),
    "matmul_int8": ("matmul", "reduction"),
    "matmul": ("reduction",),
    "layout_transform": ("injective",),
}


def target_family(target) -> str:
    return "cpu" if target.kind.name == "llvm" else target.kind.name


__all__ = ["FALLBACK", "REGISTER_TILED", "RULES", "classify", "target_family"]
