"""AffineGrid whose size is fed at run time (TVM 0.27's converter takes a constant size only). The size's length
is static (4 for 2-D, 5 for 3-D), so the grid's rank is known: its spatial dims become symbolic dims bound per
run, the batch is theta's. As onnx's reference: each spatial axis of length L samples [-1, 1] at L points,
-1 + 2i / (L - 1) with align_corners (-1 alone where L is 1), -1 + (2i + 1) / L without; the homogeneous grid
(x, y[, z], 1), x along the last axis, times theta's transpose per batch."""

from __future__ import annotations

from ..errors import UnsupportedModelError
from .tvm_dynamic_shapes import runtime_dims, runtime_tensor, static_length


def _axis_points(bb, length, dtype: str, align_corners: bool):
    """The sample points of one spatial axis of run-time length `length` (a symbolic dim)."""
    from tvm import relax

    op = relax.op
    i = bb.normalize(op.arange(0, length, 1, dtype))
    n = bb.normalize(
        op.astype(bb.normalize(op.reshape(bb.normalize(op.shape_to_tensor(relax.ShapeExpr([length]))), [])), dtype)
    )
    one, two = relax.const(1, dtype), relax.const(2, dtype)
    if align_corners:
        return op.where(op.greater(n, one), op.subtract(op.divide(op.multiply(i, two), op.subtract(n, one)), one), -one)
    return op.subtract(op.divide(op.add(op.multiply(i, two), one), n), one)


def runtime_affine_grid(bb, theta, size, align_corners: bool, node: str):
    from tvm import relax

    op = relax.op
    k = static_length(size, "AffineGrid", node)
    nd = k - 2
    if nd not in (2, 3) or theta.ty.shape is None:
        raise UnsupportedModelError(
            f"AffineGrid node {node!r}: a size of length {k} (4 or 5 are taken) or a theta of unknown shape",
            where="AffineGrid",
            fix="give size as [N, C, H, W] or [N, C, D, H, W]",
        )
    dtype = str(theta.ty.dtype)
    spatial = runtime_dims(bb, bb.normalize(op.strided_slice(op.astype(size, "int64"), [0], [2], [k])), nd, "grid")
    full = relax.ShapeExpr([*spatial, 1])
    coords = []
    for d, length in enumerate(spatial):  # outermost (z or y) first
        shape = [1] * nd + [1]
        shape[d] = length
        coords.append(
            op.broadcast_to(op.reshape(_axis_points(bb, length, dtype, align_corners), relax.ShapeExpr(shape)), full)
        )
    ones = op.ones(full, dtype)
    grid = op.concat([*reversed(coords), ones], axis=nd)  # (..., nd + 1): x first
    count = 1
    for length in spatial:
        count = count * length
    flat = op.reshape(grid, relax.ShapeExpr([1, count, nd + 1]))
    out = op.matmul(flat, op.permute_dims(theta, [0, 2, 1]))  # (N, count, nd)
    batch = theta.ty.shape.values[0]
    return op.reshape(bb.normalize(out), relax.ShapeExpr([batch, *spatial, nd]))


def affine_grid_converter():
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class AffineGrid(f.AffineGrid):
        @classmethod
        def _impl_v20(cls, bb, inputs, attr, params):
            if not runtime_tensor(inputs[1], params):
                return super()._impl_v20(bb, inputs, attr, params)
            node = attr["tvm_custom"]["name"] or "(unnamed)"
            return runtime_affine_grid(bb, inputs[0], inputs[1], bool(attr.get("align_corners", 0)), node)

    return AffineGrid
