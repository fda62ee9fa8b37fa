"""Kernels reduced row by row over their last axis (layer norm; softmax's max and sum): each row's
reductions, then its output, computed together in one parallel loop over rows, and every
reduction vectorized into lane-wide partial sums (rfactor) that one short loop adds up.

A scalar reduction is one add chain: 128 dependent adds per row, at the adder's latency (3-4
cycles), not its throughput: TOPI's layer norm ran several times slower that way than with 16-lane
partial sums, and the zoo transformer's layer norms were a noticeable share of its time (timings in
benchmarks/history.md)."""

from __future__ import annotations

from tvm import s_tir

from .rules import COMM_REDUCE, DATA_PAR, blocks, extent, inline_all_but, iter_types, rowwise
from .tiles import vector_width


def lane_partials(sch: s_tir.Schedule, block, lanes: int):
    """Split the block's last (reduction) loop by lanes and rfactor the lanes out: returns the
    partial-sum block (the reduction into `lanes` accumulators), or None when the loop is not a
    multiple of the lanes (the block keeps its scalar loop). Call at the root, before compute_at."""
    k = sch.get_loops(block)[-1]
    n = extent(sch, k)
    if n % lanes or n < 2 * lanes:
        return None
    _, ki = sch.split(k, [None, lanes])
    return sch.rfactor(ki, factor_axis=len(sch.get_loops(block)) - 2)


def vectorize_partials(sch: s_tir.Schedule, rf, lanes: int, depth: int) -> None:
    """After compute_at under `depth` loops: the partial-sum block's lane loop moved innermost (below
    its reduction loop) and vectorized."""
    own = sch.get_loops(rf)[depth:]
    lane = next(lp for lp in own[:-1] if extent(sch, lp) == lanes)
    sch.reorder(own[-1], lane)
    sch.vectorize(lane)


def _row_shape(sch: s_tir.Schedule) -> tuple[list, object] | None:
    """(reductions, output) when every block other than the output reduces its last
    axis over the output's rows (the output's loops but its last), else None."""
    bs = blocks(sch)
    out = bs[-1]
    out_loops = sch.get_loops(out)
    if len(out_loops) < 2 or any(t != DATA_PAR for t in iter_types(sch, out)):
        return None
    rows = [extent(sch, lp) for lp in out_loops[:-1]]
    reductions = []
    for b in bs[:-1]:
        types, loops = iter_types(sch, b), sch.get_loops(b)
        if len(loops) != len(types) or types != [DATA_PAR] * len(rows) + [COMM_REDUCE]:
            return None
        if [extent(sch, lp) for lp in loops[:-1]] != rows:
            return None
        reductions.append(b)
    return (reductions, out) if reductions else None


def row_reductions(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """Layer norm and its kin: rows in parallel, each row's reductions (lane partials) then its
    output. Kernels of another shape (reductions over several axes) get rules.rowwise."""
    inline_all_but(sch, [b for b in blocks(sch) if COMM_REDUCE in iter_types(sch, b)])
    shape = _row_shape(sch)
    if shape is None:
        return rowwise(sch, anchor, lanes)
    reductions, out = shape
    partials = [rf for b in reductions if (rf := lane_partials(sch, b, lanes)) is not None]
    out_loops = sch.get_loops(out)
    row = out_loops[-2]
    for b in reversed(blocks(sch)[:-1]):  # compute_at in reverse order: each lands before the previous
        sch.compute_at(b, row, preserve_unit_loops=True)
    for rf in partials:
        vectorize_partials(sch, rf, lanes, len(out_loops) - 1)
    last = sch.get_loops(out)[-1]
    w = vector_width(extent(sch, last), lanes)
    if w >= 4 and extent(sch, last) % w == 0:
        sch.vectorize(sch.split(last, [None, w])[1])
    outer = [lp for lp in sch.get_loops(out)[: len(out_loops) - 1] if extent(sch, lp) > 1]
    if outer:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


def _inline_epilogue(sch: s_tir.Schedule, block) -> None:
    """A fused epilogue computed in the block's own loop. Several consumers (BERT's where(isnan(p), 0, p)
    after the softmax) are first inlined into one another, then the last into the block."""
    while consumers := sch.get_consumers(block):
        if len(consumers) > 1:
            inlined = False
            for c in consumers:
                try:
                    sch.compute_inline(c)  # an intermediate (isnan) into the block that reads it (where)
                    inlined = True
                    break
                except s_tir.ScheduleError:  # the block writing the output, or not elementwise
                    continue
            if not inlined:
                raise s_tir.ScheduleError("the epilogue has several outputs")
            continue
        sch.reverse_compute_inline(consumers[0])


def softmax_rows(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """Softmax over the last axis (kiln/compiler/legalize.py's, with fast_exp): one row at a time,
    rows in parallel; exp(x - max) is written once per row (vectorized) and read by the sum and
    the normalization (vectorized), instead of inlined into both and computed twice, scalar."""
    by_name = {sch.get(b).name_hint: b for b in blocks(sch)}
    norm = next((b for n, b in by_name.items() if n.startswith("softmax_norm")), None)
    exp = next((b for n, b in by_name.items() if n.startswith("T_fast_exp")), None)
    shift = next((b for n, b in by_name.items() if n.startswith("softmax_shift")), None)
    if norm is None or exp is None or shift is None:
        raise s_tir.ScheduleError("not Kiln's softmax")
    sch.compute_inline(shift)
    _inline_epilogue(sch, norm)
    loops = sch.get_loops(norm)
    reductions = [b for b in blocks(sch) if COMM_REDUCE in iter_types(sch, b)]
    if len(loops) < 2 or len(reductions) != 2 or any(len(sch.get_loops(r)) != len(loops) + 1 for r in reductions):
        raise s_tir.ScheduleError("softmax is not over the last axis")
    row, last = loops[-2], loops[-1]
    feeds_exp = {sch.get(p).name_hint for p in sch.get_producers(exp)}
    max_block, sum_block = sorted(reductions, key=lambda r: sch.get(r).name_hint not in feeds_exp)
    max_rf, sum_rf = lane_partials(sch, max_block, lanes), lane_partials(sch, sum_block, lanes)
    order = (sum_block, sum_rf, exp, max_block, max_rf)  # compute_at in reverse: each lands before the previous
    for b in order:
        if b is not None:
            sch.compute_at(b, row, preserve_unit_loops=True)
    for rf in (max_rf, sum_rf):
        if rf is not None:
            vectorize_partials(sch, rf, lanes, len(loops) - 1)
    if extent(sch, last) % lanes == 0:
        for b in (exp, norm):
            sch.vectorize(sch.split(sch.get_loops(b)[-1], [None, lanes])[1])
    outer = [lp for lp in loops[:-1] if extent(sch, lp) > 1]
    if outer:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
