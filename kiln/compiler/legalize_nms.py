"""ONNX NonMaxSuppression (relax.vision.all_class_non_max_suppression) as a kernel that compares each
candidate with the boxes already kept, a vector of them at a time, and stops at the first overlap.

TVM's lowering keeps a box, then launches a parallel loop that clears every lower-scored box it
overlaps: one thread-pool launch per kept box, the classes one after another, and a scalar IoU per
pair. torchvision's detectors run NMS once over all classes at once (boxes shifted apart per class),
so SSDlite's 27000 candidates and 5760 kept boxes took longer there than in onnxruntime (timings in
benchmarks/history.md).

Here each (batch, class) row is one task of a parallel loop. As in onnxruntime, only the candidates above
the score threshold enter a heap, popped until the limit is kept (no sort of every box). The kept boxes'
corners and areas sit in a per-row workspace laid out for vector loads; each step takes two vectors of
them (the target's float32 lanes), intersections first, and divides for the IoU only where one is
positive (boxes of torchvision's shifted classes never intersect). SSDlite's NMS runs several times faster.
Semantics are onnxruntime's: candidates with score > score_threshold in descending score order (ties:
lower box index first, argsort is stable), corners taken as min/max of the given pair, a box is dropped
when its IoU with a kept box is > iou_threshold, where an empty intersection or a non-positive union is
no overlap; at most max_output_boxes_per_class per row. Output rows [batch, class, box] in that order.
"""

from __future__ import annotations

from tvm import relax, te, tirx, topi
from tvm.ir.expr import GenericConst
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..schedules.rules.apply import FLOPS_ATTR


def _scalar(buf):
    """A threshold input's scalar: a 0-d or 1-element buffer."""
    return T.buffer_proxy(buf)[() if len(buf.shape) == 0 else 0]


def _local(dtype="int32", n=1):
    return T.buffer_proxy(T.decl_buffer((n,), dtype, scope="local"))


def _any(flags, n: int):
    """flags[0] after OR-ing the upper half of flags[:n] into the lower, halving n: vector ORs (a serial
    loop over the lanes stays scalar), the flags overwritten."""
    while n > 1:
        n //= 2
        with T.vectorized(0, n) as v:
            flags[v] = flags[v] | flags[v + n]
    return flags[0]


def _sift_down(heap, top, size):
    """Restore the heap property of hs/hi[:size] below `top` (heap: the scores hs, the box indices hi, and the
    locals p, c, ti, tf it works in): the better of two candidates is the higher score, on equal scores the
    lower box index (onnxruntime's order; a stable sort's)."""
    hs, hi, p, c, ti, tf = heap

    def better(a, b):
        return tirx.any(hs[a] > hs[b], tirx.all(hs[a] == hs[b], hi[a] < hi[b]))

    p[0] = top
    with T.While(p[0] * 2 + 1 < size):
        c[0] = p[0] * 2 + 1
        with T.If(tirx.all(c[0] + 1 < size, better(tirx.min(c[0] + 1, size - 1), c[0]))):
            with T.Then():
                c[0] = c[0] + 1
        with T.If(better(c[0], p[0])):
            with T.Then():
                ti[0] = hi[p[0]]
                tf[0] = hs[p[0]]
                hi[p[0]] = hi[c[0]]
                hs[p[0]] = hs[c[0]]
                hi[c[0]] = ti[0]
                hs[c[0]] = tf[0]
                p[0] = c[0]
            with T.Else():
                p[0] = size


def _heap_of_candidates(sc, r, num_boxes: int, score_thr, heap, size) -> None:
    """Row r's boxes scoring above the threshold, pushed and heapified (score-ordered, highest first)."""
    hs, hi = heap[0], heap[1]
    size[0] = T.int32(0)
    with T.serial(0, num_boxes) as j:
        with T.If(sc[r, j] > score_thr):
            with T.Then():
                hs[size[0]] = sc[r, j]
                hi[size[0]] = j
                size[0] = size[0] + 1
    with T.serial(0, size[0] // 2) as t:
        _sift_down(heap, size[0] // 2 - 1 - t, size[0])


def _overlaps_kept(sel, cap: int, n, box, scratch, step: int, iou_thr) -> None:
    """hit[0] = whether `box` (y1, x1, y2, x2, area) overlaps a kept box (sel's planes, n[0] of them) above the
    IoU threshold: the intersections of `step` kept boxes first, the IoU's division only where one is positive."""
    y1, x1, y2, x2, area = box
    k, hit, hits, inter = scratch
    hit[0] = T.int32(0)
    k[0] = T.int32(0)
    with T.While(tirx.all(k[0] < n[0], hit[0] == 0)):
        with T.vectorized(0, step) as v:
            s = k[0] + v
            iy = tirx.max(tirx.min(y2, sel[2 * cap + s]) - tirx.max(y1, sel[s]), T.float32(0))
            ix = tirx.max(tirx.min(x2, sel[3 * cap + s]) - tirx.max(x1, sel[cap + s]), T.float32(0))
            inter[v] = tirx.Select(s < n[0], iy * ix, T.float32(0))
            hits[v] = tirx.Select(inter[v] > T.float32(0), T.int32(1), T.int32(0))
        with T.If(_any(hits, step) != 0):
            with T.Then():
                with T.vectorized(0, step) as v:
                    union = area + sel[4 * cap + k[0] + v] - inter[v]
                    over = tirx.all(inter[v] > T.float32(0), union > T.float32(0))
                    iou = inter[v] / tirx.Select(over, union, T.float32(1))
                    hits[v] = tirx.Select(tirx.all(over, iou > iou_thr), T.int32(1), T.int32(0))
                hit[0] = _any(hits, step)
        k[0] = k[0] + step


def _nms_rows(boxes, scores, iou_t, score_t, limit_t, classes: int, limit: int, lanes: int):
    """kept[r, :count[r]]: the box indices row r = batch * classes + class keeps, in score order.
    boxes: [batch * boxes, 4]; scores: [batch * classes, boxes]. Only candidates above the score threshold
    are taken, into a heap popped until min(`limit`, the run-time limit_t) boxes are kept: no full sort of
    every row. `limit` sizes the output; limit_t (a 0-d or 1-element int tensor) is the model's own limit,
    read at run time (a detector export may take max_output_boxes_per_class as an input)."""
    rows, num_boxes = scores.shape
    step = 2 * lanes  # kept boxes compared per iteration: two vectors
    cap = max((limit + step - 1) // step * step, step)

    def ir(bx, sc, it, st, lt, kept, count):
        with IRBuilder() as ib:
            bx, sc, kept, count = (T.buffer_proxy(b) for b in (bx, sc, kept, count))
            iou_thr, score_thr = _scalar(it), _scalar(st)
            wanted = tirx.max(tirx.min(_scalar(lt), tirx.const(limit, lt.dtype)), tirx.const(0, lt.dtype))
            stop = tirx.Cast("int32", wanted)
            with T.parallel(0, rows) as r:
                # the candidates' heap, and the kept boxes' corners and areas in five planes of `cap` floats
                hs = T.buffer_proxy(T.decl_buffer((num_boxes,), "float32", scope="global"))
                hi = T.buffer_proxy(T.decl_buffer((num_boxes,), "int32", scope="global"))
                sel = T.buffer_proxy(T.decl_buffer((5 * cap,), "float32", scope="global"))
                n, size, k, hit, p, c, b, ti = (_local() for _ in range(8))
                hits, inter = _local("int32", step), _local("float32", step)
                tf, box = _local("float32"), _local("float32", 5)
                heap = (hs, hi, p, c, ti, tf)
                _heap_of_candidates(sc, r, num_boxes, score_thr, heap, size)
                n[0] = T.int32(0)
                base = (r // classes) * num_boxes
                with T.While(tirx.all(size[0] > 0, n[0] < stop)):
                    b[0] = hi[0]
                    size[0] = size[0] - 1
                    hs[0] = hs[size[0]]
                    hi[0] = hi[size[0]]
                    _sift_down(heap, 0, size[0])
                    p0, p1 = bx[base + b[0], 0], bx[base + b[0], 1]
                    p2, p3 = bx[base + b[0], 2], bx[base + b[0], 3]
                    box[0], box[1] = tirx.min(p0, p2), tirx.min(p1, p3)
                    box[2], box[3] = tirx.max(p0, p2), tirx.max(p1, p3)
                    box[4] = (box[2] - box[0]) * (box[3] - box[1])
                    y1, x1, y2, x2, area = (box[i] for i in range(5))
                    _overlaps_kept(sel, cap, n, (y1, x1, y2, x2, area), (k, hit, hits, inter), step, iou_thr)
                    with T.If(hit[0] == 0):
                        with T.Then():
                            m = n[0]
                            sel[m] = y1
                            sel[cap + m] = x1
                            sel[2 * cap + m] = y2
                            sel[3 * cap + m] = x2
                            sel[4 * cap + m] = area
                            kept[r, m] = b[0]
                            n[0] = m + 1
                count[r] = n[0]
            return ib.get()

    return te.extern(
        [(rows, max(limit, 1)), (rows,)],
        [boxes, scores, iou_t, score_t, limit_t],
        lambda ins, outs: ir(*ins, *outs),
        dtype=["int32", "int32"],
        name="kiln_nms",
        tag="kiln_nms",
    )


def _collect(kept, count, offsets, classes: int, total_rows: int):
    """[batch, class, box] rows of every row's kept boxes, one row after another (ONNX's order)."""
    rows = kept.shape[0]

    def ir(kp, ct, of, out):
        with IRBuilder() as ib:
            kp, ct, of, out = (T.buffer_proxy(b) for b in (kp, ct, of, out))
            with T.parallel(0, rows) as r:
                with T.serial(0, ct[r]) as m:
                    at = of[r] + tirx.Cast("int64", m)
                    out[at, 0] = tirx.Cast("int64", r // classes)
                    out[at, 1] = tirx.Cast("int64", r % classes)
                    out[at, 2] = tirx.Cast("int64", kp[r, m])
            return ib.get()

    return te.extern(
        [(total_rows, 3)],
        [kept, count, offsets],
        lambda ins, outs: ir(*ins, *outs),
        dtype=["int64"],
        name="kiln_nms_rows",
    )


def all_class_nms(boxes, scores, iou_t, score_t, limit_t, limit: int, lanes: int):
    """(selected rows, padded to batch * classes * limit; their count as a (1,) int64 tensor)."""
    batch, classes, num_boxes = scores.shape
    flat = topi.reshape(scores, (batch * classes, num_boxes))
    flat_boxes = topi.reshape(boxes, (batch * num_boxes, 4))
    kept, count = _nms_rows(flat_boxes, flat, iou_t, score_t, limit_t, int(classes), limit, lanes)
    offsets = topi.cumsum(count, exclusive=True, dtype="int64")
    total = topi.sum(topi.cast(count, "int64"), axis=0, keepdims=True)
    rows = _collect(kept, count, offsets, int(classes), int(batch * classes * max(limit, 1)))
    return rows, total


def _slice_bounds(total):
    """begin, end and strides of the valid rows [0:total, 0:3] (computes, as TVM's lowering builds them)."""
    zero, one, three = (tirx.const(c, "int64") for c in (0, 1, 3))
    begin = te.compute((2,), lambda i: zero, name="begin")
    end = te.compute((2,), lambda i: tirx.if_then_else(i == 0, total[0], three), name="end")
    return begin, end, te.compute((2,), lambda i: one, name="strides")


def _static_limit(limit, count: int | None) -> int | None:
    """The rows each (batch, class) may keep, known at compile time: a constant limit (no more than the box
    count where that is static); a run-time limit is bounded by a static box count; None: neither."""
    if isinstance(limit, GenericConst):
        n = max(int(limit.value.numpy().reshape(-1)[0]), 0)
        return n if count is None else min(n, count)
    return count


def legalize(lanes: int, fallback):
    """The LegalizeOps entry for relax.vision.all_class_non_max_suppression: ONNX's output format with
    a constant per-class limit (what the ONNX frontend makes; the box count may be known only at run time,
    as after a score filter) or a run-time limit over a static box count, and static batch and class counts;
    anything else keeps `fallback` (TVM's lowering)."""

    def lower(bb, call):
        boxes, scores, limit, iou_t, score_t = call.args
        shape = scores.ty.shape
        static = shape is not None and all(isinstance(d, tirx.IntImm) for d in shape.values[:2])
        count = int(shape.values[-1]) if static and isinstance(shape.values[-1], tirx.IntImm) else None
        n = _static_limit(limit, count)
        if call.attrs.output_format != "onnx" or not static or n is None:
            return fallback(bb, call)
        out = bb.call_te(all_class_nms, boxes, scores, iou_t, score_t, limit, n, lanes, primfunc_name_hint="kiln_nms")
        # its loops run as far as the data says: no FLOP count (the profile's GFLOP/s would be made up)
        gv = out.args[0]
        bb.update_func(gv, bb.get()[gv].with_attr(FLOPS_ATTR, 0))
        rows, total = bb.emit(relax.TupleGetItem(out, 0)), bb.emit(relax.TupleGetItem(out, 1))
        if count is not None:
            # a static box count: every allocated row, as the op is typed; Kiln's converter
            # (frontends/tvm_nms.py, _selected_rows) slices the kept ones
            return relax.Tuple([rows, total])
        bounds = bb.call_te(_slice_bounds, total)
        begin, end, strides = (bb.emit(relax.TupleGetItem(bounds, i)) for i in range(3))
        trimmed = bb.emit(relax.op.dynamic_strided_slice(rows, begin, end, strides))
        return relax.Tuple([trimmed, total])

    return lower
