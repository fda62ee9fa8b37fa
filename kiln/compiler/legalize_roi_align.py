"""ONNX RoiAlign (relax.vision.roi_align, NCHW) computed channels-last: the feature map transposed to
NHWC, topi's roi_align_nhwc, the result transposed back.

TVM's NCHW compute works out each sample's bilinear taps (coordinates, clamps, four weights) for every
channel again, and its innermost axis is a 7-wide bin, which no vector fits: FasterRCNN's two box-head
RoiAligns (150 RoIs, 256 channels, 7x7 bins, 2x2 samples) took 35 ms of its 79 ms on Zen 4. Channels-
last, the channel axis is innermost and contiguous: the run-time-sized kernel rule (schedules/dynamic.py)
vectorizes it, and each tap's coordinates are computed once per vector of channels. The NHWC compute is
topi's own, the same arithmetic as its NCHW one. The kernel is marked opaque so that fusion cannot inline
the transpose back into it (which would read the map strided again).

Only where it pays and is the same computation: a static channel count the target's vectors divide, and a
fixed sampling ratio (ONNX sampling_ratio 0, adaptive, sizes the reduction per RoI at run time)."""

from __future__ import annotations

from tvm import tirx, topi

OPAQUE = 8  # TVM's OpPatternKind kOpaque: FuseOps fuses nothing into the kernel


def _static_int(d) -> int | None:
    return int(d) if isinstance(d, (int, tirx.IntImm)) else None


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
        out = bb.emit_te(
            topi.vision.roi_align_nhwc,
            nhwc,
            rois,
            [int(s) for s in a.pooled_size],
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
