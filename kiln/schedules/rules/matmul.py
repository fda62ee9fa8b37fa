"""The default float32 matmul schedule: a register tile of rows x column vectors.

reduction_tiled gives a matmul one row of up to 8 column vectors: each step of the reduction loads
8 weight vectors for one broadcast and 8 FMAs, so it runs at the load ports' rate, not the FMA
units' (the transformer's 128-row matmuls ran far below peak; timings in benchmarks/history.md). A tile of r rows x
v vectors does r broadcasts + v loads for r * v FMAs (MLAS's SGEMM kernels: 6 rows x 2 ymm on AVX2, 12 rows
x 2 zmm on AVX-512). The tile's size comes from the target's vector registers (caps.vector_registers,
given to the rule by ApplyDefaultSchedules): accumulators leave room for the v weight vectors and
a broadcast.

Rows and columns of a matmul of activations (attention's 197 x 197 scores per head: both primes) are padded
to a whole register tile (tiles.padded_tile: the least padded work per FMA per load) when that beats the
best divisor tile by ROUND_ROWS_GAIN; a column count with no vector width of 4 or more (an output layer of
129 frequency bins or 37 classes) is padded to a whole number of vectors. Constant weights are padded at
compile time (PackDenseWeights); others, up to PAD_LIMIT, here (`_pad`): copied into a zero-padded buffer
each call, the epilogue computed per tile over the real part. enh_conv_bilstm's [100, 192] x [192, 129] +
sigmoid ran about ten times faster (benchmarks/history.md); the unpadded kernel fell back to reduction_tiled's
scalar columns.

With more columns than rows the column panels are the outer loop, so the weights stream from memory once
(ddddocr's [40, 1024] x [1024, 8208] classifier ran almost twice as fast); else the row blocks are."""

from __future__ import annotations

from tvm import s_tir

from .rules import (
    COMM_REDUCE,
    DATA_PAR,
    blocks,
    extent,
    inline_all_but,
    iter_types,
    parallel_vectorize,
    strided_lanes,
    tile_accumulator,
    tile_consumers,
    vectorize_tails,
)
from .tiles import CACHE_BYTES, matmul_tile, padded_tile, vector_width

MIN_ROWS = 2  # a matmul of fewer rows keeps reduction_tiled's column tile (a classifier's [1, K] x [K, N])
PAD_LIMIT = 1 << 18  # the most weights (K x N) padded each call; constant weights are padded at compile time


def tile_shape(rows: int, vectors: int, registers: int) -> tuple[int, int]:
    """(r, v): divisors of the row count and of the column vectors (tiles.matmul_tile)."""
    return matmul_tile(rows, vectors, registers)


def matmul_tiled(sch: s_tir.Schedule, anchor, lanes: int, registers: int = 16) -> None:
    """[..., M, K] x [K, N] (and batched): loops (..., rows, column vectors, K) with an (r x v x lanes)
    register tile accumulated over all of K, the epilogue (bias, activation) computed per tile."""
    inline_all_but(sch, [anchor])
    types = iter_types(sch, anchor)
    loops = sch.get_loops(anchor)
    if len(loops) != len(types) or types[-1] != COMM_REDUCE or types.count(COMM_REDUCE) != 1:
        raise s_tir.ScheduleError("not a matmul with one reduction innermost")
    spatial, (k,) = loops[:-1], loops[-1:]
    if len(spatial) < 2 or any(t != DATA_PAR for t in types[:-1]):
        raise s_tir.ScheduleError("not a matmul with rows and columns")
    if len(spatial) > 2 and extent(sch, spatial[-2]) == 1 and _shared_weight(sch, anchor):
        # [T, 1, K] x [K, N] (a recurrence's input projection over T steps of batch 1): the steps are the rows.
        # One row per tile read each weight vector once per step: ddddocr's LSTM projections ran slowly
        spatial = [*spatial[:-3], sch.fuse(spatial[-3], spatial[-2]), spatial[-1]]
    rows, cols = spatial[-2], spatial[-1]
    vec = vector_width(extent(sch, cols), lanes)
    outside = []  # epilogue blocks over the unpadded columns: scheduled on their own after the tile
    plan = _padding_plan(sch, anchor, rows, cols, k, lanes, registers)
    if plan is not None:
        outside = _pad(sch, anchor, lanes, plan[:2])
        loops = sch.get_loops(anchor)
        spatial, (k,) = loops[:-1], loops[-1:]
        rows, cols = spatial[-2], spatial[-1]
        vec = lanes
    if extent(sch, rows) < MIN_ROWS or vec < 4:
        raise s_tir.ScheduleError("too few rows or columns for a 2-D register tile")
    if strided_lanes(sch, anchor):
        raise s_tir.ScheduleError("the columns are read with a stride (a transposed operand)")
    consumers = tile_consumers(sch, anchor) + cropping_consumers(sch, anchor)
    names = {sch.get(c).name_hint for c in consumers}
    outside += [
        n for n in (sch.get(c).name_hint for c in sch.get_consumers(anchor)) if n not in names and n not in outside
    ]
    m, n = extent(sch, rows), extent(sch, cols)
    jo, ji = sch.split(cols, [None, vec])
    r, v = plan[2:] if plan is not None else tile_shape(extent(sch, rows), extent(sch, jo), registers)
    cols_outer = _columns_outer(m, n, extent(sch, k), r, v * vec)
    io, ii = sch.split(rows, [None, r])
    joo, joi = sch.split(jo, [None, v])
    lead = list(spatial[:-2])
    outer, inner = (joo, io) if cols_outer else (io, joo)
    sch.reorder(*lead, outer, inner, k, ii, joi, ji)
    cache = tile_accumulator(sch, anchor, inner, consumers, keep_misfits=True)
    sch.vectorize(ji)
    vectorize_tails(sch, [cache, *consumers], vec, split=True)
    sch.unroll(ii)
    sch.unroll(joi)
    par = [*[lp for lp in lead if extent(sch, lp) > 1], outer, inner]
    sch.parallel(sch.fuse(*par) if len(par) > 1 else par[0])
    sch.decompose_reduction(anchor, k)
    for name in outside:  # consumers writing fewer elements than the tile (the real columns, a slice)
        try:
            parallel_vectorize(sch, sch.get_sblock(name), lanes)
        except s_tir.ScheduleError:  # it keeps its loops as they are: correct, serial
            pass


def _columns_outer(m: int, n: int, depth: int, r: int, cols_per_group: int) -> bool:
    """Loop order of the tiles: each column group swept over every row block (True) or each row block over every
    column group, whichever reads less from beyond L2. An operand larger than CACHE_BYTES is read again for every
    block of the other operand's loop (Whisper's FFN-down [1500, 1536] x [1536, 384], rows outer: its 2.4 MB of
    weights once per 6-row block, 590 MB a call, bound by L3 bandwidth at 2 threads); a smaller one stays in
    cache. At equal traffic, the bigger extent outside (a classifier over 8210 characters, 40 steps: columns).
    Timings in benchmarks/history.md."""
    w, x = 4 * depth * n, 4 * m * depth
    rows_outer = x + w * (-(-m // r) if w > CACHE_BYTES else 1)
    cols_outer = w + x * (-(-n // cols_per_group) if x > CACHE_BYTES else 1)
    return cols_outer < rows_outer if cols_outer != rows_outer else n > m


def cropping_consumers(sch: s_tir.Schedule, anchor) -> list:
    """Consumers that read the real part of an anchor computed over rows (and columns) rounded up to the
    register tile (PackDenseWeights' matmul_packed_padded, or _pad here): same rank and leading dims, fewer
    rows or columns. Computed at each tile, they cover its real part (TVM bounds the last tiles' regions by a
    predicate), so the epilogue stays in the tile instead of another pass over the output."""
    out = sch.get(anchor).writes[0].source.shape
    found = []
    for c in sch.get_consumers(anchor):
        shape = sch.get(c).writes[0].source.shape
        dims = [(int(a), int(b)) for a, b in zip(shape, out)]
        if (
            len(shape) == len(out)
            and dims[-2][0] <= dims[-2][1]
            and dims[-1][0] <= dims[-1][1]
            and dims[-2:] != [(b, b) for _, b in dims[-2:]]
        ):
            if all(a == b for a, b in dims[:-2]):
                found.append(c)
    return found


def _shared_weight(sch: s_tir.Schedule, anchor) -> bool:
    """The block reads a 2-D operand while writing a higher-rank output: one weight for every batch."""
    block = sch.get(anchor)
    out_rank = len(block.writes[0].source.shape)
    return out_rank > 2 and any(len(r.source.shape) == 2 for r in block.reads)


def _padding_plan(sch: s_tir.Schedule, anchor, rows, cols, k, lanes: int, registers: int):
    """(row factor, column factor, r, v) to pad a matmul of activations by (tiles.padded_tile) when its rows or
    columns have no good register tile (attention's 197 x 197 scores: primes) or its columns no whole vectors,
    and the operands are small enough to copy each call; None to keep it as it is. Constant weights are never
    padded here: PackDenseWeights padded them once at compile time."""
    if sch.get(anchor).name_hint.startswith("matmul_packed"):
        return None
    m, n, depth = extent(sch, rows), extent(sch, cols), extent(sch, k)
    if m < MIN_ROWS or n <= lanes or max(m, n) * depth > PAD_LIMIT:
        return None
    pm, pv, r, v = padded_tile(m, -(-n // lanes), registers)
    if pm == m and pv * lanes == n:
        return None
    return (r if pm != m else 1, v * lanes if pv * lanes != n else 1, r, v)


def _pad(sch: s_tir.Schedule, anchor, lanes: int, factors: tuple[int, int]) -> list[str]:
    """Pad the anchor's rows and columns to multiples of `factors` (pad_einsum): its operands' padded copies
    are blocks of their own, vectorized here; the copy of the real part back joins the epilogue. Returns the
    names of the epilogue blocks that cannot be computed per tile (the rest: cropping_consumers)."""
    pad = [1] * len(sch.get_loops(anchor))
    pad[-3], pad[-2] = factors
    before = {sch.get(b).name_hint for b in blocks(sch)}
    sch.pad_einsum(anchor, pad)
    operands = [b for b in sch.get_producers(anchor) if sch.get(b).name_hint not in before]
    inline_all_but(sch, [anchor, *operands])
    for b in operands:
        parallel_vectorize(sch, b, lanes)
    cropping = {sch.get(c).name_hint for c in cropping_consumers(sch, anchor)}
    return [n for n in (sch.get(c).name_hint for c in sch.get_consumers(anchor)) if n not in cropping]
