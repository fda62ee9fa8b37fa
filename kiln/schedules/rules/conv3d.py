"""conv3d's default schedule: output channels vectorized (legalize_conv3d's compute reads weights
[O/c, I, KD, KH, KW, c]), a register tile of v channel vectors x t output pixels along the width,
sized by the target's vector registers, reduced over input channels and the kernel's window inside
the tile; parallel over output depth x rows. The padded input is written once (no condition in the
FMA loop); the accumulator tile is [pixel, channel] in registers and written back, with the
epilogue, along the width."""

from __future__ import annotations

from tvm import s_tir

from .rules import (
    COMM_REDUCE,
    DATA_PAR,
    extent,
    inline_all_but,
    iter_types,
    pad_producer,
    parallel_vectorize,
    tile_consumers,
    vectorize_tails,
)
from .tiles import divisor_at_most

SPARE_REGISTERS = 4  # the tile's weight vectors and a broadcast input


def conv3d_tile(registers: int, width: int, channel_vectors: int) -> tuple[int, int]:
    """(v, t): channel vectors and pixels per register tile (v * t accumulators + v weight vectors)."""
    t = divisor_at_most(width, 8)
    v = 2 if channel_vectors % 2 == 0 and 2 * t <= registers - SPARE_REGISTERS else 1
    return v, t


def conv3d_oc_vectorized(sch: s_tir.Schedule, anchor, lanes: int, registers: int = 32) -> None:
    types = iter_types(sch, anchor)
    if types != [DATA_PAR] * 5 + [COMM_REDUCE] * 4:
        raise s_tir.ScheduleError("not a 3-D conv: 5 spatial and 4 reduction iterators")
    c = int(sch.get(anchor).reads[1].source.shape[-1])
    pad = pad_producer(sch, anchor)
    inline_all_but(sch, [anchor] + ([pad] if pad is not None else []))
    consumers = tile_consumers(sch, anchor)
    n, o, d, h, w, ic, kd, kh, kw = sch.get_loops(anchor)
    o_o, o_i = sch.split(o, [None, c])
    v, t = conv3d_tile(registers, extent(sch, w), extent(sch, o_o))
    o_oo, o_ov = sch.split(o_o, [None, v])
    w_o, w_i = sch.split(w, [None, t])
    sch.reorder(n, d, h, o_oo, w_o, ic, kd, kh, kw, o_ov, w_i, o_i)
    cache = sch.cache_write(anchor, 0, "local")
    sch.transform_layout(anchor, ("write", 0), lambda a, ch, z, y, x: (a, z, y, x, ch))  # channels innermost
    sch.reverse_compute_at(cache, w_o, preserve_unit_loops=True)
    for b in consumers:
        sch.reverse_compute_at(b, w_o, preserve_unit_loops=True)
    sch.vectorize(o_i)
    sch.unroll(w_i)
    sch.unroll(o_ov)
    sch.parallel(sch.fuse(n, d, h))
    sch.decompose_reduction(anchor, ic)
    if pad is not None:
        parallel_vectorize(sch, pad, lanes)
    if t >= 4:
        vectorize_tails(sch, [cache, *consumers], t)
