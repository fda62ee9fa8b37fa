"""The NCHW 1x1 conv rule: pointwise convs whose channels cannot be blocked (MobileNetV2's 24, ShuffleNet's 58),
scheduled as a matmul of [OC, IC] by [IC, H*W] with a register tile of output channels x a vector of pixels."""

from __future__ import annotations

from tvm import s_tir

from .rules import (
    COMM_REDUCE,
    DATA_PAR,
    extent,
    inline_all_but,
    iter_types,
    tile_accumulator,
    tile_consumers,
    vectorize_tails,
)
from .tiles import divisor_at_most

PADDED_WIDTH_WASTE = 8  # a row padded to one vector: at most 1/8 of its lanes wasted (14 -> 16, 7 -> 8)
POINTWISE_MIN_ROWS = 4  # narrower channel tiles load about as often as they multiply (conv2d_nchw_oc does as well)


def pointwise_rows(oc: int, registers: int) -> int:
    """Output channels per register tile of conv_nchw_pointwise: 8 where they divide, else the largest
    divisor that leaves a register for the pixel vector and one spare (ShuffleNet's 58 and 116 channels:
    29 on AVX-512's 32 registers, 4 or 2 on AVX2's 16); 0 when under POINTWISE_MIN_ROWS."""
    if oc % 8 == 0:
        return 8
    r = divisor_at_most(oc, registers - 2)
    return r if r >= POINTWISE_MIN_ROWS else 0


def conv_nchw_pointwise(sch: s_tir.Schedule, anchor, lanes: int, registers: int = 16) -> None:
    """NCHW 1x1 conv2d (channel counts that cannot be blocked, e.g. 24 or ShuffleNet's 58): a matmul of [OC, IC]
    by [IC, H*W]. The conv and its epilogue iterate over flat pixels p = h*W + w (block layouts
    transformed, so each tile's region is exact; fusing the h and w loops instead makes TVM
    over-approximate the write-back region and copy stale values). Vectorize over pixels,
    register-tile pointwise_rows output channels x `lanes` pixels, reduce over input channels inside
    the tile. A pixel count that is no multiple of the lanes (14 x 14) cannot be flat: with a partial last
    vector TVM scalarizes the tile, and with buffer-level predication it gathers x[c, p // w, p % w] lane by
    lane. Rows a little narrower than a vector are padded to one instead (_padded_rows); others keep
    conv2d_nchw_oc."""
    types = iter_types(sch, anchor)
    loops = sch.get_loops(anchor)
    if types != [DATA_PAR] * 4 + [COMM_REDUCE] * 3 or extent(sch, loops[5]) != 1 or extent(sch, loops[6]) != 1:
        raise s_tir.ScheduleError("not a 1x1 NCHW conv")
    h, w = extent(sch, loops[2]), extent(sch, loops[3])
    rows = pointwise_rows(extent(sch, loops[1]), registers)
    if rows and (h * w) % lanes and w < lanes and w * PADDED_WIDTH_WASTE >= lanes * (PADDED_WIDTH_WASTE - 1):
        return _padded_rows(sch, anchor, lanes, rows)
    if (h * w) % lanes or not rows:
        raise s_tir.ScheduleError("pixels not divisible by the lanes, or output channels with no register tile")
    inline_all_but(sch, [anchor])
    consumers = tile_consumers(sch, anchor)
    if not consumers:  # the conv writes the kernel's output: flattening that buffer would change the signature
        raise s_tir.ScheduleError("no epilogue block to write the output in its own layout")
    if any(len(sch.get_loops(c)) != 4 for c in consumers):
        raise s_tir.ScheduleError("an epilogue that is not NCHW elementwise")
    sch.transform_layout(anchor, ("write", 0), lambda n, c, y, x: (n, c, y * w + x))
    sch.transform_block_layout(anchor, lambda n, c, y, x, rc, ry, rx: (n, c, y * w + x, rc, ry, rx))
    for c in consumers:
        sch.transform_block_layout(c, lambda n, ch, y, x: (n, ch, y * w + x))
    n, oc, p, ic, kh, kw = sch.get_loops(anchor)
    p_o, p_i = sch.split(p, [None, lanes])
    oc_o, oc_i = sch.split(oc, [None, rows])
    sch.reorder(n, oc_o, p_o, ic, kh, kw, oc_i, p_i)
    cache = tile_accumulator(sch, anchor, p_o, consumers)
    sch.vectorize(p_i)
    vectorize_tails(sch, [cache, *consumers], lanes)
    sch.unroll(oc_i)
    # a wide tile leaves few channel tiles (58 channels: 2), so the pixel tiles share the threads too
    sch.parallel(sch.fuse(n, oc_o) if rows == 8 else sch.fuse(n, oc_o, p_o))
    sch.decompose_reduction(anchor, ic)


def _padded_rows(sch: s_tir.Schedule, anchor, lanes: int, rows: int) -> None:
    """A map whose rows are a little narrower than a vector (ShuffleNet's 14 x 14 on 16 lanes): each row
    padded to one vector (pad_einsum: a zero-padded copy of the input, the conv over whole vectors, the
    real columns copied out), then the same register tile as the flat rule, a row of pixels per tile.
    ShuffleNet's 116-channel convs on 14 x 14 maps ran slowly on the generic rule (timings in benchmarks/history.md)."""
    sch.transform_block_layout(anchor, lambda n, c, y, x, rc, ry, rx: (n, c, y, x, rc))  # 1x1: einsum indices
    # padded before the producers are inlined (a channel shuffle's slice would give the input non-plain indices);
    # then they are inlined into the padded copy, and the copy of the real columns into the epilogue
    sch.pad_einsum(anchor, [1, 1, 1, lanes, 1])
    x_pad = sch.get_producers(anchor)
    inline_all_but(sch, [anchor, *x_pad])
    consumers = sch.get_consumers(anchor)
    n, oc, y, x, ic = sch.get_loops(anchor)
    oc_o, oc_i = sch.split(oc, [None, rows])
    sch.reorder(n, oc_o, y, ic, oc_i, x)
    cache = tile_accumulator(sch, anchor, y, consumers)
    sch.vectorize(x)
    sch.unroll(oc_i)
    for b in [cache, *consumers]:
        inner = sch.get_loops(b)[-1]
        if extent(sch, inner) in (lanes, sch.get(b).writes[0].source.shape[-1]):
            sch.vectorize(inner)
    sch.parallel(sch.fuse(n, oc_o, y))
    for b in x_pad:
        loops = sch.get_loops(b)
        sch.parallel(sch.fuse(*loops[:-1]))
    sch.decompose_reduction(anchor, ic)
