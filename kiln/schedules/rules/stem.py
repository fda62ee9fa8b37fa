"""The blocked conv2d rule: a stem (NarrowBlockLayout's conv reading a few unblocked input channels, NCHW1c,
and writing NCHW{c}c) takes stem_nchwc; every other blocked conv rules.reduction_tiled.

A 3-channel stem has too few input channels for reduction_tiled's tile: it inlined the padding into the FMA
loop (a bounds test per tap) and tiled by output blocks, which ran ResNet-50's 7x7/2 stem well behind the
NCHW schedule (rules.conv_nchw_oc_vectorized), so that stem stayed NCHW and its max pool ran unblocked and
strided, several times slower than blocked, with a layout transform after it (timings in benchmarks/history.md).
stem_nchwc is conv_nchw_oc_vectorized's loop nest on the blocked layouts: the padded input rows one output row
reads are written once to a stack buffer, each input pixel is broadcast into a tile of up to 8 pixels x one
vector of output channels, and the weights, already [O/c, I, KH, KW, 1, c] (laid out at compile time), are
read one contiguous vector per tap. Its accumulator tile is the output's own layout, so no transposes."""

from __future__ import annotations

from tvm import s_tir

from .rules import (
    MAX_STACK_FLOATS,
    extent,
    inline_all_but,
    pad_producer,
    parallel_rows,
    reduction_tiled,
    tile_accumulator,
    tile_consumers,
    vectorize_tails,
)
from .tiles import divisor_at_most

STEM_TILE_PIXELS = 8  # the tile's pixels: 8 accumulators, as conv_nchw_oc_vectorized
STEM_INPUT_BLOCK = 4  # input channel blocks up to this are stems' (NarrowBlockLayout blocks the others by 8 or more)


def is_stem(sch: s_tir.Schedule, anchor) -> bool:
    """A blocked conv reading a stem's few input channels (NCHW1c, up to NCHW4c) into a wider output block
    (not 24 -> 144 channels on AVX-512, NCHW8c -> NCHW16c: a conv for reduction_tiled)."""
    b = sch.get(anchor)
    if not b.name_hint.startswith("conv2d_NCHWc") or len(b.reads) < 2 or len(b.writes) != 1:
        return False
    data, out = b.reads[0].source.shape, b.writes[0].source.shape
    return len(data) == 5 and len(out) == 5 and int(data[4]) <= STEM_INPUT_BLOCK < int(out[4])


def stem_nchwc(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """NCHW{b}c -> NCHW{c}c conv2d with b < c (topi's conv2d_NCHWc: loops n, oc_chunk, oh, ow, oc_block,
    ic, kh, kw): parallel over output rows, a [pixels x oc_block] accumulator tile, padding per row."""
    if not is_stem(sch, anchor):
        raise s_tir.ScheduleError("not a blocked conv with a narrow input block")
    loops = sch.get_loops(anchor)
    if len(loops) != 8:
        raise s_tir.ScheduleError("not topi's conv2d_NCHWc loop nest")
    pad = pad_producer(sch, anchor, ("data_pad", "pad"))
    if pad is not None:  # the input rows of one output row, padded, on the stack
        shape = [int(d) for d in sch.get(pad).writes[0].source.shape]
        if shape[1] * shape[4] * extent(sch, loops[6]) * shape[3] > MAX_STACK_FLOATS:
            pad = None
    inline_all_but(sch, [anchor] + ([pad] if pad is not None else []))
    consumers = tile_consumers(sch, anchor)
    n, occ, oh, ow, ocb, ic, kh, kw = loops
    t = divisor_at_most(extent(sch, ow), STEM_TILE_PIXELS)
    ow_o, ow_i = sch.split(ow, [None, t])
    sch.reorder(n, oh, occ, ow_o, ic, kh, kw, ow_i, ocb)
    cache = tile_accumulator(sch, anchor, ow_o, consumers, keep_misfits=True)
    sch.vectorize(ocb)
    sch.unroll(ow_i)
    parallel_rows(sch, n, oh, occ, pad)
    sch.decompose_reduction(anchor, ic)
    vectorize_tails(sch, [cache, *consumers], extent(sch, ocb))


def conv2d_blocked(sch: s_tir.Schedule, anchor, lanes: int, registers: int = 32) -> None:
    if is_stem(sch, anchor):
        return stem_nchwc(sch, anchor, lanes)
    return reduction_tiled(sch, anchor, lanes, registers)
