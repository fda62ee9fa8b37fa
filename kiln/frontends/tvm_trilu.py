"""Trilu whose k is fed at run time. TVM 0.27's converter has a run-time-k path, but it builds the row and
column indices from unnormalized expressions and stops ("The type is not populated") before any model runs.
The same mask, normalized: keep x where column - row >= k (upper) or <= k (lower), zero elsewhere."""

from __future__ import annotations

from .tvm_dynamic_shapes import runtime_tensor


def trilu_converter():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Trilu(f.Trilu):
        @classmethod
        def _impl_v14(cls, bb, inputs, attr, params):
            x = inputs[0]
            k = inputs[1] if len(inputs) > 1 else None
            if not runtime_tensor(k, params) or x.ty.shape is None:
                return super()._impl_v14(bb, inputs, attr, params)
            op = relax.op
            rows, cols = x.ty.shape.values[-2], x.ty.shape.values[-1]
            row = bb.normalize(op.reshape(bb.normalize(op.arange(0, rows, 1, "int64")), relax.ShapeExpr([rows, 1])))
            col = bb.normalize(op.reshape(bb.normalize(op.arange(0, cols, 1, "int64")), relax.ShapeExpr([1, cols])))
            diff = bb.normalize(op.subtract(col, row))
            k = bb.normalize(op.reshape(bb.normalize(op.astype(k, "int64")), []))
            keep = op.greater_equal(diff, k) if attr.get("upper", 1) else op.less_equal(diff, k)
            return op.where(bb.normalize(keep), x, relax.const(0, x.ty.dtype))

    return Trilu
