"""Default schedule for kernels sized at run time (detection heads: the RoI count, the boxes NMS
keeps). The static rules read loop extents; these kernels have symbolic ones, and left to TVM's
default lowering they run single-threaded and scalar: FasterRCNN's box-head matmul took almost all
of its run (benchmarks/history.md). The rule uses only the extents that are constants: it
parallelizes over the outer spatial loops (whatever their size), vectorizes a constant innermost
spatial axis, and register-tiles a reduction over a constant output axis (lanes wide, over a few
rows of the run-time axis, whose tail a predicate guards). ScheduleError when it does not apply."""

from __future__ import annotations

from tvm import s_tir, tirx

from .rules import COMM_REDUCE, DATA_PAR, blocks, inline_all_but, iter_types
from .tiles import vector_width

MIN_PARALLEL_TILES = 8  # column tiles enough to share among the cores; fewer: the row tiles are shared
MAX_ROWS = 8  # rows of the run-time axis per register tile (its tail is predicated: more rows, more waste)


def dynamic_tile(vectors: int, registers: int) -> tuple[int, int]:
    """(r, v): rows of the run-time axis and column vectors (a divisor of `vectors`) of a register tile:
    r * v accumulators, v weight vectors and a broadcast within the registers, the most FMAs per load
    (FasterRCNN's box head, 1024 columns: 6 x 4 zmm on AVX-512, 6 x 2 ymm on AVX2)."""
    best, best_key = (1, 1), 0.0
    for v in (1, 2, 3, 4, 6, 8):
        r = min(MAX_ROWS, (registers - v - 1) // v)
        if vectors % v or r < 1:
            continue
        if r * v / (r + v) > best_key:
            best, best_key = (r, v), r * v / (r + v)
    return best


def _const(sch, loop) -> int | None:
    e = sch.get(loop).extent
    return int(e) if isinstance(e, (int, tirx.IntImm)) else None


def _spatial(sch, block, lanes: int) -> None:
    """Fuse the loops outside a constant, vectorizable innermost axis and parallelize them."""
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    n = _const(sch, inner)
    vec = vector_width(n, lanes) if n else 1
    outer = list(loops[:-1])
    if vec > 1:
        o, i = sch.split(inner, [None, vec])
        sch.vectorize(i)
        outer.append(o)
    else:
        outer.append(inner)
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


def _reduction(sch, block, lanes: int, registers: int) -> None:
    """loops [spatial..., reduce...]: the last spatial axis, if constant, becomes v lanes-wide vectors
    innermost, under the reductions; a run-time spatial axis is tiled by r rows inside them (dynamic_tile)."""
    loops = sch.get_loops(block)
    types = iter_types(sch, block)
    if len(loops) != len(types) or set(types) - {DATA_PAR, COMM_REDUCE}:
        raise s_tir.ScheduleError("dynamic reduction: loops do not map to the block's iterators")
    n_sp = types.index(COMM_REDUCE) if COMM_REDUCE in types else len(types)
    if types[n_sp:] != [COMM_REDUCE] * (len(types) - n_sp) or n_sp == 0:
        raise s_tir.ScheduleError("dynamic reduction: spatial loops must come first")
    spatial, reduce = list(loops[:n_sp]), list(loops[n_sp:])
    last = _const(sch, spatial[-1])
    vec = vector_width(last, lanes) if last else 1
    if vec < 4 or vec & (vec - 1):  # not whole registers (RoIAlign's 7 bins): parallel only
        sch.parallel(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0])
        return
    jo, ji = sch.split(spatial[-1], [None, vec])
    rows = [i for i, lp in enumerate(spatial[:-1]) if _const(sch, lp) is None]
    r, v = dynamic_tile(_const(sch, jo), registers) if rows else (1, 1)
    joo, joi = sch.split(jo, [None, v])
    tile = []
    if rows:  # the run-time axis closest to the vectors: r rows share each weight vector
        i = rows[-1]
        ro, ri = sch.split(spatial[i], [None, r])
        spatial[i] = ro
        tile = [ri]
    outer = [joo, *spatial[:-1]]  # the output-axis tile outermost: its weight slab stays in cache over the rows
    sch.reorder(*outer, *reduce, *tile, joi, ji)
    if len(outer) == 2 and rows:
        # [rows, columns]: not fused, so the register tile's indices stay plain loop variables. Fused with
        # the run-time row count, the tile's offsets are div/mod expressions the buffer compaction cannot
        # cancel, and the accumulators were a stack array (a load and a store per FMA; benchmarks/history.md)
        sch.parallel(joo if _const(sch, joo) >= MIN_PARALLEL_TILES else outer[1])
        tile_loop = outer[1]
    else:
        tile_loop = sch.fuse(*outer)
        sch.parallel(tile_loop)
    sch.vectorize(ji)  # before the init is split off: the update alone is not a complete block
    for lp in (*tile, joi):
        sch.unroll(lp)
    acc = sch.cache_write(block, 0, "local")  # the tile's sums in registers, written back once
    sch.reverse_compute_at(acc, tile_loop, preserve_unit_loops=True)
    inner = sch.get_loops(acc)[-1]
    if _const(sch, inner) == vec:
        sch.vectorize(inner)
    sch.decompose_reduction(block, reduce[0])


def dynamic(sch: s_tir.Schedule, lanes: int, registers: int = 16) -> None:
    """Schedule every block of a run-time-sized kernel (after inlining its injective blocks)."""
    if any(set(iter_types(sch, b)) - {DATA_PAR, COMM_REDUCE} for b in blocks(sch)):
        raise s_tir.ScheduleError("dynamic: an ordered or opaque iterator (a scan): its loops must stay serial")
    reductions = [b for b in blocks(sch) if COMM_REDUCE in iter_types(sch, b)]
    inline_all_but(sch, reductions)
    for b in blocks(sch):
        if not sch.get_loops(b):
            continue
        if COMM_REDUCE in iter_types(sch, b):
            _reduction(sch, b, lanes, registers)
        else:
            _spatial(sch, b, lanes)
