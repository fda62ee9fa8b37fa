"""Default schedule of a depthwise + 1x1 conv kernel (kiln/compiler/passes/fuse_depthwise_pointwise.py):
parallel over output rows (and halves of the output channels when there are fewer than 8 rows);
per row, the depthwise conv of all channels into a stack buffer
(register-tiled like a direct conv: `t` pixels x the channel block's lanes, its bias/clamp applied
per tile), then the 1x1 conv of that row from the buffer (t pixels x the output block's lanes of
accumulators, reduced over all channels), the epilogue (bias, residual add) per tile."""

from __future__ import annotations

from tvm import s_tir

from .rules import MIN_PARALLEL_TASKS, block_named, extent, inline_all_but, tile_accumulator, vectorize_tails
from .tiles import conv_register_tile, divisor_at_most

MAX_TILE = 8  # pixels per register tile
MAX_ROW_FLOATS = 16384  # 64 KiB: the depthwise row buffer on each thread's stack


def depthwise_pointwise(sch: s_tir.Schedule, anchor, lanes: int, registers: int = 32) -> None:
    dw, act = block_named(sch, "dwpw_depthwise"), block_named(sch, "dwpw_act")
    inline_all_but(
        sch, [dw, act, anchor]
    )  # the padding into the depthwise conv, the epilogue chain into its last block
    consumers = sch.get_consumers(anchor)
    _, cb, _, ow, c = (int(v) for v in sch.get(act).writes[0].source.shape)
    if cb * ow * c > MAX_ROW_FLOATS:
        raise s_tir.ScheduleError("the depthwise row does not fit the stack buffer")

    # 1x1 conv: rows in parallel (with few rows, e.g. 7, also the two halves of the output blocks,
    # each computing the row's depthwise conv itself); per row, output blocks x pixel tiles, all
    # channels reduced in registers
    n, o, y, x, j, r = sch.get_loops(anchor)
    halves = extent(sch, n) * extent(sch, y) < MIN_PARALLEL_TASKS and extent(sch, o) % 2 == 0
    outer = []
    if halves:
        oh_, o = sch.split(o, [2, None])
        outer = [oh_]
    # 16 registers (AVX2): conv_register_tile's pixels x output blocks, the channels of a buffer block unrolled
    # (constant offsets, as in reduction_tiled's 1x1 convs)
    narrow = conv_register_tile(ow, extent(sch, o), registers)
    t = narrow[0] if narrow else divisor_at_most(ow, MAX_TILE)
    xo, xi = sch.split(x, [None, t])
    tile = [xi]
    if narrow and narrow[1] > 1:
        o, oi = sch.split(o, [None, narrow[1]])
        tile = [oi, xi]
    reduce = [r]
    if narrow and extent(sch, r) % c == 0:
        reduce = list(sch.split(r, [None, c]))
    sch.reorder(n, y, *outer, o, xo, *reduce, *tile, j)
    acc = tile_accumulator(sch, anchor, xo, consumers)
    sch.vectorize(j)
    for lp in tile + reduce[1:]:
        sch.unroll(lp)
    vectorize_tails(sch, [acc, *consumers], extent(sch, j))
    row = sch.fuse(n, y, *outer)

    # the row's depthwise conv (+ bias, clamp) on the stack, computed before its 1x1 conv
    sch.compute_at(act, row, preserve_unit_loops=True)
    sch.compute_at(dw, row, preserve_unit_loops=True)
    sch.set_scope(act, 0, "local")
    sch.set_scope(dw, 0, "local")
    i, _, dx, k, rh, rw = sch.get_loops(dw)[-6:]
    dxo, dxi = sch.split(dx, [None, t])
    sch.reorder(i, dxo, rh, rw, dxi, k)
    dacc = tile_accumulator(sch, dw, dxo, [act])
    sch.vectorize(k)
    sch.unroll(dxi)
    for b in (dacc, act):
        sch.vectorize(sch.get_loops(b)[-1])
    sch.parallel(row)
    sch.decompose_reduction(dw, rh)
    sch.decompose_reduction(anchor, reduce[0])
