"""BlockGroupedConv: grouped convolutions (ResNeXt, RegNet: 8 to 64 channels per group; not depthwise,
which PropagateBlockedLayout blocks) in NCHW{b}c, as one kernel with a block-aligned group structure.

TVM 0.27 has no blocked grouped conv. Before this pass a grouped conv of a few groups was split into one
conv per group on an NCHW tensor (a layout transform in and out of each: RegNetY-400MF's first stage,
6 groups of 8 at 112x112, spent a sixth of its run in the transforms and the split) and one of more groups
ran TVM's NCHW group conv, slowly (timings in benchmarks/history.md).

Here the conv reads and writes the block b its channel count gets everywhere else (the widest power of two
up to the vector width that divides it, as ConvertLayout and NarrowBlockLayout choose), so the transforms
around it cancel against its neighbours' (PropagateBlockedLayout):
  - groups whose input and output channels are multiples of b: output block o reads the input blocks of
    its own group only (legalize.grouped_conv2d_nchwc), weights [O/b, I/g/b, KH, KW, b, b];
  - groups narrower than the block (8 per group in 16-channel blocks): k = b / (channels per group)
    adjacent groups merge into one of b channels with block-diagonal weights (zeros across groups), k at
    most MAX_MERGE: k times the multiply-adds of a cheap conv (8 per output for a 3x3 of 8 channels per
    group) for no layout transform;
  - otherwise a narrower block that divides the groups' channels, at least MIN_BLOCK, with transforms.
Only float32 convs with constant weights. `stats["grouped_convs_blocked"]` counts them, `stats["groups_merged"]`
the convs whose groups were merged."""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from .convert_layout import widest_block
from .counting import static_shape
from .module_map import rewrite_calls
from .narrow_block_layout import MIN_BLOCK, block_map, blocked_conv2d, unblock_map

MAX_MERGE = 2  # groups merged into one block at most: the multiply-adds this many times over


def plan(c_in: int, groups: int, per_out: int, block: int) -> tuple[int, int] | None:
    """(block b, groups merged k) for a grouped conv of `groups` groups of c_in / groups input and
    per_out output channels, or None when no block of MIN_BLOCK or more fits its groups."""
    per_in = c_in // groups
    b = widest_block(c_in, block)
    if b >= MIN_BLOCK and per_in % b == 0 and per_out % b == 0:
        return b, 1
    k = b // per_in if per_in and b % per_in == 0 else 0
    if b >= MIN_BLOCK and per_in == per_out and 1 < k <= MAX_MERGE and groups % k == 0:
        return b, k
    b = widest_block(math.gcd(per_in, per_out), block)
    return (b, 1) if b >= MIN_BLOCK else None


def merged_weights(w: np.ndarray, groups: int, k: int) -> np.ndarray:
    """OIHW weights of `groups` groups -> those of groups / k groups, each k adjacent groups' filters
    side by side on a block diagonal (an output channel reads only its own group's input channels)."""
    o, per_in, kh, kw = w.shape
    per_out = o // groups
    out = np.zeros((o, per_in * k, kh, kw), w.dtype)
    for c in range(o):
        r = (c // per_out) % k  # the original group's place within its merged group
        out[c, r * per_in : (r + 1) * per_in] = w[c]
    return out


def _blocked(builder, call, block: int, merged: list):
    """The grouped conv `call` blocked, or None when it is not one this pass takes; appends to `merged` when
    its groups were merged."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
        return None
    a = call.attrs
    x, w = call.args
    shape = static_shape(x)
    g = int(a.groups)
    if (
        g == 1
        or str(a.data_layout) != "NCHW"
        or str(a.kernel_layout) != "OIHW"
        or str(a.out_layout) != "NCHW"
        or not isinstance(w, GenericConst)
        or shape is None
        or len(shape) != 4
        or (str(x.ty.dtype), str(w.value.dtype)) != ("float32", "float32")
    ):
        return None
    wa = w.value.numpy()
    o, per_in, kh, kw = wa.shape
    if per_in * g != shape[1] or per_in == 1 or o % g:
        return None
    found = plan(shape[1], g, o // g, block)
    if found is None:
        return None
    b, k = found
    if k > 1:
        wa, g = merged_weights(wa, g, k), g // k
        merged.append(k)
    per_in = wa.shape[1]
    w_b = wa.reshape(o // b, b, per_in // b, b, kh, kw).transpose(0, 2, 4, 5, 3, 1)
    x_b = builder.emit(relax.op.layout_transform(x, index_map=block_map(b)))
    conv = blocked_conv2d(a, x_b, w_b, b, b, groups=g)
    return relax.op.layout_transform(builder.emit(conv), index_map=unblock_map(b))


# what BlockGroupedConv counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("grouped_convs_blocked", int, "grouped convs rewritten to run blocked"),
    Counter("groups_merged", int, "groups merged into wider blocked convs"),
)


@tvm.transform.module_pass(opt_level=2, name="BlockGroupedConv")
class BlockGroupedConv:
    COUNTERS = COUNTERS

    def __init__(self, layout: str, block: int):
        self.layout, self.block = layout, block
        self.stats = {"grouped_convs_blocked": 0, "groups_merged": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        if self.layout != "NCHWc":
            return mod
        merged: list = []
        mod, count = rewrite_calls(mod, lambda b, call: _blocked(b, call, self.block, merged))
        self.stats["grouped_convs_blocked"], self.stats["groups_merged"] = count, len(merged)
        return mod


__all__ = ["BlockGroupedConv"]
