"""Default schedule of a Winograd conv kernel (kiln/compiler/winograd.py): the input transform
per tile (rows kept on the stack, both passes unrolled, channels in vector lanes), the alpha^2
GEMMs register-tiled as (tiles x output-channel blocks x lanes) like a 1x1 conv, and the output
transform per tile with the epilogue (bias, activation) inlined into its last pass."""

from __future__ import annotations

from tvm import s_tir

from .rules import block_named, blocks, extent, inline_all_but
from .tiles import conv_register_tile, divisor_at_most

MAX_TILE_ROWS = 8  # tiles per register tile
MAX_ACCUMULATORS = 16  # vector accumulators per register tile


def winograd_nchwc(sch: s_tir.Schedule, anchor, lanes: int, registers: int = 32) -> None:
    names = ("winograd_input_rows", "winograd_input", "winograd_gemm", "winograd_output_rows")
    keep = [block_named(sch, n) for n in names]
    inline_all_but(sch, keep)  # the padding into the input rows, the output transform into the epilogue
    in_rows, v, gemm, out_rows = (block_named(sch, n) for n in names)
    (out,) = [b for b in blocks(sch) if not sch.get_consumers(b)]

    # input transform: V[e, u, i, p, k] for one tile p of one channel block i at a time
    e, u, i, p, k = sch.get_loops(v)
    sch.reorder(i, p, e, u, k)
    sch.compute_at(in_rows, p, preserve_unit_loops=True)
    for lp in sch.get_loops(in_rows)[2:-1]:
        sch.unroll(lp)
    sch.vectorize(sch.get_loops(in_rows)[-1])
    sch.unroll(e)
    sch.unroll(u)
    sch.vectorize(k)
    sch.parallel(sch.fuse(i, p))

    # GEMMs: M[e, u, o, p, j] = sum_k V[e, u, k / c, p, k % c] U[e, u, o, k, j]
    e, u, o, p, j, k = sch.get_loops(gemm)
    n_p, n_o = extent(sch, p), extent(sch, o)
    # 16 registers (AVX2): the 1x1 conv's tile (16 accumulators spilled; benchmarks/history.md), and the
    # channels of a block unrolled, so V and U are read at constant offsets, not through (k / c, k % c)
    narrow = conv_register_tile(n_p, n_o, registers)
    pt, ot = narrow or (divisor_at_most(n_p, MAX_TILE_ROWS), 0)
    ot = ot or divisor_at_most(n_o, max(1, MAX_ACCUMULATORS // pt))
    po, pi = sch.split(p, [None, pt])
    oo, oi = sch.split(o, [None, ot])
    block = int(sch.get(gemm).reads[0].source.shape[-1])
    if narrow and extent(sch, k) % block == 0:
        ko, ki = sch.split(k, [None, block])
        sch.reorder(e, u, oo, po, ko, oi, pi, ki, j)
        sch.reorder(e, u, oo, po, ko, ki, oi, pi, j)
        sch.unroll(ki)
        k = ko
    else:
        sch.reorder(e, u, oo, po, k, oi, pi, j)
    acc = sch.cache_write(gemm, 0, "local")
    sch.reverse_compute_at(acc, po, preserve_unit_loops=True)
    sch.vectorize(j)
    sch.unroll(pi)
    sch.unroll(oi)
    sch.vectorize(sch.get_loops(acc)[-1])
    sch.parallel(sch.fuse(e, u, oo))
    sch.decompose_reduction(gemm, k)

    # output transform: one m x m tile at a time, rows on the stack, epilogue in the last pass
    m = extent(sch, sch.get_loops(out_rows)[2])
    loops = sch.get_loops(out)
    if len(loops) != 5:
        raise s_tir.ScheduleError("the winograd output is not [n, o, h, w, c]")
    n, o, y, x, j = loops
    yo, yi = sch.split(y, [None, m])
    xo, xi = sch.split(x, [None, m])
    sch.reorder(n, o, yo, xo, yi, xi, j)
    sch.compute_at(out_rows, xo, preserve_unit_loops=True)
    for lp in sch.get_loops(out_rows)[-3:-1]:
        sch.unroll(lp)
    sch.vectorize(sch.get_loops(out_rows)[-1])
    sch.unroll(yi)
    sch.unroll(xi)
    sch.vectorize(j)
    sch.parallel(sch.fuse(n, o, yo))
