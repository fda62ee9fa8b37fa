"""The NCHW depthwise and narrow grouped conv rule: channels that cannot be blocked (MobileNetV2's
24-channel stage) and groups of a few input channels (RegNet's 8), vectorized along the output width."""

from __future__ import annotations

from tvm import s_tir

from .rules import (
    COMM_REDUCE,
    DATA_PAR,
    extent,
    inline_all_but,
    iter_types,
    pad_producer,
    tile_accumulator,
    tile_consumers,
    vectorize_tails,
)
from .tiles import divisor_at_most, vector_width

GROUP_ACCUMULATORS = 8  # a grouped NCHW conv's register tile: output channels x vectors of a row
MAX_GROUP_WIDTH = 16  # input channels per group depthwise_nchw takes (RegNet: 8, measured); wider: reduction_tiled


def _conv_stride_w(sch: s_tir.Schedule, anchor, data, kw_loop, out_w: int) -> int:
    """The width stride of a conv block, from its (padded) input width, kernel width and output width."""
    in_w = (
        int(sch.get(data).writes[0].source.shape[-1])
        if data is not None
        else int(sch.get(anchor).reads[1].source.shape[-1])
    )
    return (in_w - extent(sch, kw_loop)) // (out_w - 1) if out_w > 1 else 1


def depthwise_nchw(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """NCHW depthwise conv2d (channels that cannot be blocked, e.g. MobileNetV2's 24-channel stage):
    vectorize along the output width, `k` vectors of accumulators per row. The padding is not
    inlined as a condition in the inner loop (per lane, so no vector loads): each channel's padded
    plane is written once, per core, just before its conv; for stride 2 that plane is stored
    de-interleaved ([.., w % 2, w // 2]) so the strided reads become contiguous vector loads.
    Several times faster than reduction_tiled on MobileNetV2's NCHW depthwise kernels (benchmarks/history.md)."""
    loops = sch.get_loops(anchor)
    if iter_types(sch, anchor) != [DATA_PAR] * 4 + [COMM_REDUCE] * 3 or extent(sch, loops[4]) > MAX_GROUP_WIDTH:
        raise s_tir.ScheduleError("not a depthwise or narrow grouped NCHW conv")
    pad = pad_producer(sch, anchor)
    inline_all_but(sch, [anchor] + ([pad] if pad is not None else []))
    consumers = tile_consumers(sch, anchor)
    n, c, oh, ow, rc, ry, rx = sch.get_loops(anchor)
    width = extent(sch, ow)
    stride = _conv_stride_w(sch, anchor, pad, rx, width)
    if pad is not None and stride == 2:
        sch.transform_layout(pad, ("write", 0), lambda a, b, h, w: (a, b, h, w % 2, w // 2))
    vec = vector_width(width, lanes)
    ow_o, ow_i = sch.split(ow, [None, vec])
    k = divisor_at_most(extent(sch, ow_o), 8)
    ow_oo, ow_k = sch.split(ow_o, [None, k])
    c, channels = _group_channel_tile(sch, anchor, c, rc, k)
    sch.reorder(n, c, oh, ow_oo, rc, ry, rx, *channels, ow_k, ow_i)
    cache = tile_accumulator(sch, anchor, ow_oo, consumers)
    sch.vectorize(ow_i)
    sch.unroll(ow_k)
    for ci in channels:
        sch.unroll(ci)
    vectorize_tails(sch, [cache, *consumers], vec, split=True)
    par = sch.fuse(n, c)
    sch.parallel(par)
    if pad is not None:
        sch.compute_at(pad, par, preserve_unit_loops=True)
    sch.decompose_reduction(anchor, rc)


def _group_channel_tile(sch: s_tir.Schedule, anchor, c, rc, k: int) -> tuple:
    """A grouped conv (rc: its input channels per group) takes several output channels of one group
    into the register tile, each input vector loaded once for all of them: a row of a 14- or 7-wide
    map is one vector, so one output channel alone is one FMA chain. (c's outer loop, [its tile loop]),
    or (c, []) when there is no tile."""
    width = extent(sch, rc)
    if width == 1:
        return c, []
    groups = int(sch.get(anchor).reads[0].source.shape[1]) // width
    per_group = extent(sch, c) // max(groups, 1)
    t = divisor_at_most(per_group, max(1, GROUP_ACCUMULATORS // k)) if per_group * groups == extent(sch, c) else 1
    if t == 1:
        return c, []
    outer, inner = sch.split(c, [None, t])
    return outer, [inner]
