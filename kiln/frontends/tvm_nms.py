"""Kiln's NonMaxSuppression converter for TVM 0.27's ONNX importer (installed by tvm_converters).

TVM's converter reads max_output_boxes_per_class, iou_threshold and score_threshold only as constants and
silently takes its own defaults for anything else, so a detector exported with its thresholds as inputs
ran with iou 0.5 and no limit. None of the three decides a shape the compiler needs: the thresholds are
read by the kernel at run time, and the per-class limit only trims rows of an output that is sized per
run anyway, allocated for the static box count. So all three stay run-time inputs here; a constant
limit is clamped to the box count (torchvision writes sys.maxsize). Absent inputs take ONNX's defaults
(no boxes kept without a limit, iou 0, no score filter)."""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedModelError
from .tvm_bounds import bound, upper

NMS_ROWS_LIMIT = 1 << 24  # selected-index rows TVM's NMS may allocate (batch * classes * per-class limit)
DEFAULTS = {3: 0.0, 4: float("-inf")}  # iou_threshold, score_threshold when the input is absent


def nms_converter():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class NonMaxSuppression(f.NonMaxSuppression):
        @classmethod
        def _impl_v10(cls, bb, inputs, attr, params):
            ins = [inputs[i] if i < len(inputs) else None for i in range(5)]
            boxes, scores = (_with_shape(bb, ins[i], i) for i in (0, 1))
            if attr.get("center_point_box", 0):
                boxes = _corners(bb, boxes)
            given = [None if x is None else f.get_constant(x, params) for x in ins]
            limit = _limit(bb, given[2], scores)
            iou, score = (_threshold(bb, given[i], i) for i in (3, 4))
            out = bb.normalize(
                relax.op.vision.all_class_non_max_suppression(boxes, scores, limit, iou, score, output_format="onnx")
            )
            return _selected_rows(bb, out, scores)

    return NonMaxSuppression


def _selected_rows(bb, out, scores):
    """The selected indices sliced to the rows kept, with a symbolic row count. TVM types them (batch * classes
    * limit, 3), the rows allocated; typed so, what reads them was sized for every allocated row (a Reshape to
    -1 after a Gather made 22638 values from 112, reading past the kept ones: issue 51's SSDlite with run-time
    thresholds). With static scores (batch, classes and boxes), legalize_nms.py's kernel returns the allocated
    rows, as typed, and this slice keeps as many as it counted; otherwise the type is symbolic and the lowering
    (Kiln's or TVM's) trims the rows itself (RetinaNet's boxes after TopK). A match_cast of the untrimmed value
    alone would be folded back to its static type."""
    import tvm
    from tvm import relax

    selected, total = (bb.emit(relax.TupleGetItem(out, i)) for i in (0, 1))
    shape = scores.ty.shape if isinstance(scores.ty, relax.TensorType) else None
    if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return selected
    begin, three, strides = (relax.const(np.array(v, np.int64), "int64") for v in ([0, 0], [3], [1, 1]))
    end = bb.emit(relax.op.concat([relax.op.astype(total, "int64"), three], axis=0))
    kept = bb.emit(relax.op.dynamic_strided_slice(selected, begin, end, strides))
    rows = tvm.tirx.Var("nms_selected_rows", "int64")
    bound(rows, selected.ty.shape.values[0])
    return bb.match_cast(kept, relax.TensorType([rows, 3], "int64"))


def _with_shape(bb, x, i: int):
    """boxes or scores of unknown shape match-cast to a symbolic one (TVM's type inference crashed the
    process on a shapeless NMS input)."""
    import tvm
    from tvm import relax

    ty = x.ty
    if isinstance(ty, relax.TensorType) and ty.shape is None and ty.ndim == 3:
        dims = [tvm.tirx.Var(f"nms{i}_{d}", "int64") for d in range(3)]
        return bb.match_cast(x, relax.TensorType(dims, ty.dtype))
    return x


def _corners(bb, boxes):
    """center_point_box=1: [x_center, y_center, width, height] -> [y1, x1, y2, x2] (the kernel takes each
    box's corners as the min/max of coordinates 0, 2 and 1, 3)."""
    from tvm import relax

    xc, yc, w, h = (bb.emit(relax.TupleGetItem(bb.emit(relax.op.split(boxes, 4, axis=2)), i)) for i in range(4))
    half = relax.const(0.5, boxes.ty.dtype)
    hw, hh = bb.emit(relax.op.multiply(w, half)), bb.emit(relax.op.multiply(h, half))
    parts = [relax.op.subtract(yc, hh), relax.op.subtract(xc, hw), relax.op.add(yc, hh), relax.op.add(xc, hw)]
    return bb.emit(relax.op.concat([bb.emit(p) for p in parts], axis=2))


def _threshold(bb, x, i: int):
    """iou_threshold (i=3) or score_threshold (i=4) as a float32 scalar (0-d, as TVM's NMS lowering reads it):
    a constant, or the run-time value."""
    import tvm
    from tvm import relax

    if x is None:
        return relax.const(np.float32(DEFAULTS[i]), "float32")
    if isinstance(x, tvm.ir.GenericConst):
        return relax.const(np.asarray(x.value.numpy(), np.float32).reshape(()), "float32")
    return bb.emit(relax.op.reshape(relax.op.astype(x, "float32"), []))


def _limit(bb, x, scores):
    """max_output_boxes_per_class as an int64 scalar: a constant clamped to the box count's static
    bound, or the run-time value over a static box count (its rows are allocated for every box)."""
    import tvm
    from tvm import relax

    dims = scores.ty.shape.values if isinstance(scores.ty, relax.TensorType) and scores.ty.shape is not None else None
    if x is None:
        return relax.const(np.int64(0), "int64")
    if isinstance(x, tvm.ir.GenericConst):
        limit = int(np.asarray(x.value.numpy()).reshape(-1)[0])
        count = upper(dims[-1]) if dims is not None else None
        if count is not None:
            limit = min(limit, max(count, 1))
        _check_rows(dims, limit, scores)
        return relax.const(np.int64(limit), "int64")
    if dims is None or not isinstance(dims[-1], tvm.tirx.IntImm):
        raise UnsupportedModelError(
            f"NonMaxSuppression with a run-time max_output_boxes_per_class on scores of shape {scores.ty}: its "
            "output rows are allocated for every box, and the number of boxes is known only at run time",
            where="NonMaxSuppression",
            fix="export the limit as a constant, freeze that input (--freeze-input NAME=VALUE), or pin the "
            "number of boxes with --input-shape",
        )
    _check_rows(dims, int(dims[-1]), scores)
    return bb.emit(relax.op.reshape(relax.op.astype(x, "int64"), []))


def _check_rows(dims, limit: int, scores) -> None:
    """TVM's NMS allocates batch * classes * limit rows of selected indices: refuse what has no static
    bound (TVM would size the output by a guess, and write past it) or would not fit."""
    rows = limit if dims is not None else None
    for d in dims[:-1] if dims is not None else ():
        u = upper(d)
        rows = rows * u if rows is not None and u is not None else None
    if rows is None or rows > NMS_ROWS_LIMIT:
        raise UnsupportedModelError(
            f"NonMaxSuppression with max_output_boxes_per_class={limit} on scores of shape {scores.ty}: its output "
            f"would need {'an unbounded number of' if rows is None else rows} rows (TVM sizes it as batch * classes "
            "* limit and has no bound on a run-time box count)",
            where="NonMaxSuppression",
            fix="export with a smaller max_output_boxes_per_class, or with a static number of boxes",
        )
