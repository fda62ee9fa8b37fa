"""Col2Im whose image_shape and block_shape are fed at run time (the constant case is a MatMul with a constant
scatter matrix, decompose/standard_spatial.py; TVM 0.27 has no converter). The input (N, C * K, L) is static
and the shapes' lengths are too, so the output's rank is known: C = (C * K) / K and the image dims become
symbolic dims bound per run. Every input element's destination is computed per run from static-length
index vectors: channel c and block offset k of its row (k unravelled over block_shape), grid position of its
column (unravelled over the grid the block, strides, pads and dilations leave), its pixel that offset times
the dilation from the column's corner; the elements are then summed into their pixels by a scatter-add, the
ones that fall in the padding into one spare slot past the end, sliced off. Attributes stay constants."""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedModelError
from .tvm_dynamic_shapes import check, i64, runtime_dims, runtime_tensor, static_length


def _unravel(flat, dims: list) -> list:
    """Row-major coordinates of int64 indices `flat` over the run-time dims (0-d tensors)."""
    from tvm import relax

    out, rest = [None] * len(dims), flat
    for d in reversed(range(len(dims))):
        out[d] = relax.op.floor_mod(rest, dims[d])
        rest = relax.op.floor_divide(rest, dims[d])
    return out


def runtime_col2im(bb, x, image, block, attr, node: str):
    from tvm import relax

    op = relax.op
    nd = static_length(image, "Col2Im", node)
    if static_length(block, "Col2Im", node) != nd or x.ty.shape is None or x.ty.ndim != 3:
        raise UnsupportedModelError(
            f"Col2Im node {node!r}: image_shape and block_shape of different lengths, or an input not (N, C*K, L)",
            where="Col2Im",
            fix="give one block dim per image dim",
        )
    n, ck, cols = (int(d) for d in x.ty.shape.values)
    dil, strides = attr.get("dilations", [1] * nd), attr.get("strides", [1] * nd)
    pads = attr.get("pads", [0] * 2 * nd)

    def entry(t, d):
        return bb.normalize(op.take(op.astype(t, "int64"), relax.const(d, "int64"), axis=0))

    img, blk = [entry(image, d) for d in range(nd)], [entry(block, d) for d in range(nd)]
    k_all = blk[0]
    for b in blk[1:]:
        k_all = bb.normalize(op.multiply(k_all, b))
    channels = bb.normalize(op.floor_divide(i64(ck), k_all))
    check(bb, op.equal(op.multiply(channels, k_all), i64(ck)), f"Col2Im node {node!r}: C*K is not a multiple of K")
    grid = [
        op.add(
            op.floor_divide(
                op.subtract(
                    op.add(img[d], i64(pads[d] + pads[d + nd] - 1)),
                    op.multiply(i64(dil[d]), op.subtract(blk[d], i64(1))),
                ),
                i64(strides[d]),
            ),
            i64(1),
        )
        for d in range(nd)
    ]
    rows = relax.const(np.arange(ck, dtype=np.int64).reshape(ck, 1), "int64")
    koff = _unravel(op.floor_mod(rows, k_all), blk)  # (CK, 1) each
    lpos = _unravel(relax.const(np.arange(cols, dtype=np.int64).reshape(1, cols), "int64"), grid)  # (1, L)
    flat, inside = None, None
    for d in range(nd):
        coord = op.add(
            op.subtract(op.multiply(lpos[d], i64(strides[d])), i64(pads[d])), op.multiply(koff[d], i64(dil[d]))
        )
        ok = op.logical_and(op.greater_equal(coord, i64(0)), op.less(coord, img[d]))
        inside = ok if inside is None else op.logical_and(inside, ok)
        flat = coord if flat is None else op.add(op.multiply(flat, img[d]), coord)
    dims = runtime_dims(
        bb, bb.normalize(op.concat([op.reshape(v, [1]) for v in [channels, *img]], axis=0)), nd + 1, "col2im"
    )
    total = dims[0]
    for v in dims[1:]:
        total = total * v
    spare = bb.normalize(op.reshape(op.shape_to_tensor(relax.ShapeExpr([total])), []))
    pixels = img[0]
    for v in img[1:]:
        pixels = op.multiply(pixels, v)
    dest = op.where(inside, op.add(op.multiply(op.floor_divide(rows, k_all), pixels), flat), spare)
    idx = op.broadcast_to(op.reshape(bb.normalize(dest), [1, ck * cols]), [n, ck * cols])
    zeros = op.zeros(relax.ShapeExpr([n, total + 1]), x.ty.dtype)
    out = op.scatter_elements(zeros, bb.normalize(idx), op.reshape(x, [n, ck * cols]), axis=1, reduction="add")
    out = op.strided_slice(bb.normalize(out), [1], [0], [total], assume_inbound=True)
    return op.reshape(bb.normalize(out), relax.ShapeExpr([n, *dims]))


def col2im_converter():
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Col2Im(f.OnnxOpConverter):
        @classmethod
        def _impl_v18(cls, bb, inputs, attr, params):
            node = attr["tvm_custom"]["name"] or "(unnamed)"
            if not (runtime_tensor(inputs[1], params) or runtime_tensor(inputs[2], params)):
                raise UnsupportedModelError(
                    f"Col2Im node {node!r} reached TVM with constant shapes", where="Col2Im", fix="report it"
                )
            return runtime_col2im(bb, inputs[0], inputs[1], inputs[2], attr, node)

    return Col2Im
