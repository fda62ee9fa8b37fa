"""ONNX RoiAlign (relax.vision.roi_align, NCHW) computed channels-last: the feature map transposed to
NHWC, topi's roi_align_nhwc, the result transposed back.

TVM's NCHW compute works out each sample's bilinear taps (coordinates, clamps, four weights) for every
channel again, and its innermost axis is a 7-wide bin, which no vector fits: FasterRCNN's two box-head
RoiAligns (150 RoIs, 256 channels, 7x7 bins, 2x2 samples) took almost half its run (timings in
benchmarks/history.md). Channels- last, the channel axis is innermost and contiguous: the run-time-sized kernel rule
(schedules/rules/dynamic.py) vectorizes it, and each tap's coordinates are computed once per vector of channels. The
NHWC compute is topi's own, the same arithmetic as its NCHW one. The kernel is marked opaque so that fusion cannot
inline the transpose back into it (which would read the map strided again).

Average mode computes topi's arithmetic in two steps. A sample's row and column are separable: its row
depends on (RoI, bin row, sample row) only, its column on (RoI, bin column, sample column). A first kernel
tabulates both: the two taps each and their weights, zero outside the map. The channels-last kernel then does
four vector gathers and multiply-adds per sample. Written out per element as topi does, the taps' expression
is so long that the register tile's 12 unrolled copies took LLVM seconds per kernel. That compute is
kept for max mode.

Only where it pays and is the same computation: a static channel count the target's vectors divide, and a
fixed sampling ratio (ONNX sampling_ratio 0, adaptive, sizes the reduction per RoI at run time)."""

from __future__ import annotations

from tvm import relax, te, tirx, topi

OPAQUE = 8  # TVM's OpPatternKind kOpaque: FuseOps fuses nothing into the kernel


def _static_int(d) -> int | None:
    return int(d) if isinstance(d, (int, tirx.IntImm)) else None


def _taps(rois, pooled: int, ratio: int, spatial_scale: float, aligned: bool, size: int, start: int):
    """For one axis (rows: start 2, columns: start 1 of a RoI [batch, x1, y1, x2, y2]): [RoI, bin, sample, 2]
    tap indices (int32) and weights: topi's coordinate, clamped to the map, floor and floor + 1 (clamped:
    its weight is then 0), weights 1 - frac and frac, both 0 where the sample lies outside the map."""
    dtype = rois.dtype
    n = rois.shape[0]
    f = lambda v: tirx.const(v, dtype)

    def coord(i, p, r):
        lo, hi = rois[i, start] * f(spatial_scale), rois[i, start + 2] * f(spatial_scale)
        extent = hi - lo if aligned else te.max(hi - lo, f(1.0))
        bin_ = extent / f(pooled)
        return lo + tirx.Cast(dtype, p) * bin_ + (tirx.Cast(dtype, r) + f(0.5)) * bin_ / f(ratio)

    def clamped(i, p, r):
        return te.min(te.max(coord(i, p, r), f(0.0)), f(size - 1))

    def index(i, p, r, k):
        low = tirx.Cast("int32", te.floor(clamped(i, p, r)))
        return tirx.Select(k == 0, low, te.min(low + 1, size - 1))

    def weight(i, p, r, k):
        c = clamped(i, p, r)
        frac = c - tirx.Cast(dtype, tirx.Cast("int32", te.floor(c)))
        w = tirx.Select(k == 0, f(1.0) - frac, frac)
        y = coord(i, p, r)
        return tirx.if_then_else(tirx.any(y < f(-1.0), y > f(size)), f(0.0), w)

    shape = (n, pooled, ratio, 2)
    return te.compute(shape, index, name="roi_tap_index"), te.compute(shape, weight, name="roi_tap_weight")


def tap_tables(data, rois, pooled_size, spatial_scale: float, ratio: int, aligned: bool):
    """The rows' and the columns' tap indices and weights (_taps) of topi.vision.roi_align_nhwc in avg
    mode with a fixed sampling ratio, for data [N, H, W, C]."""
    height, width = (int(d) for d in data.shape[1:3])
    ph, pw = pooled_size
    yi, yw = _taps(rois, ph, ratio, spatial_scale, aligned, height, 2)
    xi, xw = _taps(rois, pw, ratio, spatial_scale, aligned, width, 1)
    return yi, yw, xi, xw


def gather_taps(data, rois, yi, yw, xi, xw, ratio: int):
    """[RoI, bin row, bin column, channel]: the mean over the ratio x ratio samples of the four taps."""
    n, ph, pw, channels = yi.shape[0], yi.shape[1], xi.shape[1], data.shape[3]
    rh = te.reduce_axis((0, ratio), name="rh")
    rw = te.reduce_axis((0, ratio), name="rw")
    count = tirx.const(float(ratio * ratio), data.dtype)

    def sample(i, p, q, c, r, s):
        b = tirx.Cast("int32", rois[i, 0])
        total = None
        for ky in (0, 1):
            for kx in (0, 1):
                term = yw[i, p, r, ky] * xw[i, q, s, kx] * data[b, yi[i, p, r, ky], xi[i, q, s, kx], c]
                total = term if total is None else total + term
        return total / count

    return te.compute(
        (n, ph, pw, channels),
        lambda i, p, q, c: te.sum(sample(i, p, q, c, rh, rw), axis=[rh, rw]),
        name="roi_align_gather",
    )


def legalize(lanes: int, fallback):
    """The LegalizeOps entry for relax.vision.roi_align; anything it does not take keeps `fallback`."""

    def lower(bb, call):
        a = call.attrs
        data, rois = call.args
        shape = data.ty.shape
        channels = _static_int(shape.values[1]) if shape is not None and len(shape.values) == 4 else None
        if a.layout != "NCHW" or int(a.sample_ratio) <= 0 or channels is None or channels % lanes:
            return fallback(bb, call)
        nhwc = bb.emit_te(topi.transpose, data, [0, 2, 3, 1], primfunc_name_hint="roi_align_input")
        pooled = [int(v) for v in a.pooled_size]
        static_map = all(_static_int(d) is not None for d in shape.values[2:])
        if str(a.mode) == "avg" and static_map and data.ty.dtype == rois.ty.dtype == "float32":
            taps = bb.emit_te(
                tap_tables,
                nhwc,
                rois,
                pooled,
                float(a.spatial_scale),
                int(a.sample_ratio),
                bool(a.aligned),
                primfunc_name_hint="roi_align_taps",
            )
            parts = [bb.emit(relax.TupleGetItem(taps, k)) for k in range(4)]
            out = bb.emit_te(
                gather_taps, nhwc, rois, *parts, int(a.sample_ratio), primfunc_name_hint="roi_align_channels_last"
            )
        else:
            out = bb.emit_te(
                topi.vision.roi_align_nhwc,
                nhwc,
                rois,
                pooled,
                float(a.spatial_scale),
                str(a.mode),
                int(a.sample_ratio),
                bool(a.aligned),
                primfunc_name_hint="roi_align_channels_last",
            )
        gv = bb.lookup_binding(out).args[0]  # the call_tir's function
        bb.update_func(gv, bb.get()[gv].with_attr("op_pattern", OPAQUE))
        return bb.call_te(topi.transpose, out, [0, 3, 1, 2], primfunc_name_hint="roi_align_output")

    return lower
