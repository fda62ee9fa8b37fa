"""Reduce* whose axes are a run-time input (TVM 0.27's converters assert "Only constant axes currently
supported"). The input's rank is pinned and the axes tensor's length k is static, so the output's rank is
known (r with keepdims, r - k without): the reduction runs over every axis in turn, each time keeping the
reduced values where the axis is one of the run-time axes and the input where not (a Where on a scalar
flag; shapes stay static), then the result is sliced to one element along the reduced axes and, without
keepdims, reshaped to the kept dims, both of them symbolic dims bound at run time (tvm_dynamic_shapes).
Axes that repeat or fall outside [-r, r) are a run-time input error. The L1/L2/LogSum/LogSumExp/SumSquare
variants are a sum between an elementwise op before and after."""

from __future__ import annotations

import numpy as np

from .tvm_dynamic_shapes import check, dims_of, i64, runtime_dims, runtime_tensor, static_length

# op -> (per-axis reduction, elementwise op before, elementwise op after): relax.op names
REDUCTIONS = {
    "ReduceSum": ("sum", None, None),
    "ReduceMean": ("sum", None, "mean"),  # the sum divided by the run-time count (a mean per axis failed VM codegen)
    "ReduceMax": ("max", None, None),
    "ReduceMin": ("min", None, None),
    "ReduceProd": ("prod", None, None),
    "ReduceL1": ("sum", "abs", None),
    "ReduceL2": ("sum", "square", "sqrt"),
    "ReduceLogSum": ("sum", None, "log"),
    "ReduceLogSumExp": ("sum", "exp", "log"),
    "ReduceSumSquare": ("sum", "square", None),
}
INF = float("inf")
# the result over no elements (an input with a zero-size dim): onnx's reference
EMPTY = {"ReduceMean": float("nan"), "ReduceMax": -INF, "ReduceMin": INF, "ReduceProd": 1.0, "ReduceLogSum": -INF}
EMPTY["ReduceLogSumExp"] = -INF
AXES_INPUT_SINCE = {"ReduceSum": 13}  # the opset whose converter takes axes as an input (18 for the others)


def _elementwise(name, x):
    from tvm import relax

    return relax.op.multiply(x, x) if name == "square" else getattr(relax.op, name)(x)


def axis_mask(bb, axes, r: int):
    """(r,) bool: axis d is one of the run-time axes (negative ones counted from the end)."""
    from tvm import relax

    a = bb.normalize(relax.op.astype(axes, "int64"))
    a = bb.normalize(relax.op.where(relax.op.less(a, i64(0)), relax.op.add(a, i64(r)), a))
    hit = relax.op.equal(relax.op.expand_dims(a, 1), i64(np.arange(r).reshape(1, r)))
    return bb.normalize(relax.op.astype(relax.op.max(relax.op.astype(hit, "int32"), axis=[0]), "bool"))


def kept_dims(bb, mask, dims, r: int, k: int):
    """(r - k,) int64: the input's dims on the axes not reduced, in order."""
    from tvm import relax

    kept = bb.normalize(relax.op.logical_not(mask))
    rank = bb.normalize(relax.op.cumsum(relax.op.astype(kept, "int64"), axis=0))  # 1-based among kept axes
    slot = i64(np.arange(1, r - k + 1).reshape(-1, 1))
    at = relax.op.logical_and(relax.op.equal(relax.op.expand_dims(rank, 0), slot), relax.op.expand_dims(kept, 0))
    return bb.normalize(relax.op.sum(relax.op.where(at, relax.op.expand_dims(dims, 0), i64(0)), axis=[1]))


def reduce_runtime_axes(bb, op: str, data, axes, keepdims: int, noop: int, node: str):
    from tvm import relax

    core, pre, post = REDUCTIONS[op]
    r, k = data.ty.ndim, static_length(axes, op, node)
    y = _elementwise(pre, data) if pre else data
    if k == 0:  # no axes: static
        if noop:
            return data
        if post == "mean":
            return relax.op.mean(data, None, bool(keepdims))
        y = getattr(relax.op, core)(y, None, bool(keepdims))
        return _elementwise(post, y) if post else y
    mask = axis_mask(bb, axes, r)
    count = relax.op.sum(relax.op.astype(mask, "int64"))
    check(bb, relax.op.equal(count, i64(k)), f"{op} node {node!r}: the axes fed at run time repeat or are out of range")
    dims = dims_of(bb, data)
    ends = runtime_dims(bb, bb.normalize(relax.op.where(mask, i64(1), dims)), r, "reduce")
    if any(getattr(d, "value", 1) == 0 for d in data.ty.shape.values):  # no elements: the result is a constant
        dtype = str(data.ty.dtype)
        zeros = bb.normalize(relax.op.zeros(relax.ShapeExpr(ends), dtype))  # a full() of inf fails LegalizeOps
        y = relax.op.add(zeros, _empty_value(op, dtype))
        return _drop_reduced(bb, bb.normalize(y), mask, dims, r, k, keepdims)
    y = bb.normalize(y)
    for d in range(r):
        flag = bb.normalize(relax.op.take(mask, relax.const(d, "int64"), axis=0))
        y = bb.normalize(relax.op.where(flag, getattr(relax.op, core)(y, [d], True), y))
    y = bb.normalize(relax.op.strided_slice(y, list(range(r)), [0] * r, ends, assume_inbound=True))
    if post == "mean":
        count = relax.op.prod(relax.op.where(mask, dims, i64(1)))
        y = bb.normalize(relax.op.divide(y, relax.op.astype(count, data.ty.dtype)))
    elif post:
        y = bb.normalize(_elementwise(post, y))
    return _drop_reduced(bb, y, mask, dims, r, k, keepdims)


def _drop_reduced(bb, y, mask, dims, r: int, k: int, keepdims: int):
    """y (the reduced axes kept, size 1) without them unless keepdims."""
    from tvm import relax

    if keepdims:
        return y
    if r == k:
        return relax.op.reshape(y, [])
    kept = runtime_dims(bb, kept_dims(bb, mask, dims, r, k), r - k, "kept")
    return relax.op.reshape(y, relax.ShapeExpr(kept))


def _empty_value(op: str, dtype: str):
    """EMPTY[op] (0 for the sums) as a constant of dtype; infinities of integer types are its extremes."""
    from tvm import relax

    v = EMPTY.get(op, 0.0)
    if not dtype.startswith(("float", "bfloat")) and abs(v) == INF:
        info = np.iinfo(dtype)
        v = info.min if v < 0 else info.max
    return relax.const(np.array(v).astype(dtype), dtype)


def squeeze_converter():
    """Squeeze's axes fed at run time: the input reshaped to the dims not named (rank r - k, static), each
    named dim checked to be 1 at run time."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Squeeze(f.Squeeze):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            data, axes = inputs[0], inputs[1] if len(inputs) > 1 else None
            if not runtime_tensor(axes, params) or not isinstance(getattr(data, "ty", None), relax.TensorType):
                return super()._impl_v13(bb, inputs, attr, params)
            node = attr["tvm_custom"]["name"] or "(unnamed)"
            r, k = data.ty.ndim, static_length(axes, "Squeeze", node)
            mask, dims = axis_mask(bb, axes, r), dims_of(bb, data)
            count = relax.op.sum(relax.op.astype(mask, "int64"))
            ones = relax.op.logical_or(relax.op.logical_not(mask), relax.op.equal(dims, i64(1)))
            fits = relax.op.logical_and(
                relax.op.equal(count, i64(k)),
                relax.op.equal(relax.op.min(relax.op.astype(ones, "int32")), relax.const(1, "int32")),
            )
            check(
                bb,
                fits,
                f"Squeeze node {node!r}: the axes fed at run time repeat, are out of range or name a dim not 1",
            )
            if r == k:
                return relax.op.reshape(data, [])
            kept = runtime_dims(bb, kept_dims(bb, mask, dims, r, k), r - k, "squeezed")
            return relax.op.reshape(data, relax.ShapeExpr(kept))

    return Squeeze


def reduce_converter(op: str):
    """A converter class for `op` that takes run-time axes and leaves everything else to TVM's."""

    def make():
        from tvm.relax.frontend.onnx import onnx_frontend as f

        base = getattr(f, op)
        version = AXES_INPUT_SINCE.get(op, 18)
        parent = getattr(base, f"_impl_v{version}")

        def impl(cls, bb, inputs, attr, params):
            axes = inputs[1] if len(inputs) > 1 else None
            if not runtime_tensor(axes, params):
                return parent.__func__(cls, bb, inputs, attr, params)
            node = attr["tvm_custom"]["name"] or "(unnamed)"
            keepdims, noop = attr.get("keepdims", 1), attr.get("noop_with_empty_axes", 0)
            return reduce_runtime_axes(bb, op, inputs[0], axes, keepdims, noop, node)

        return type(op, (base,), {f"_impl_v{version}": classmethod(impl)})

    return make


CONVERTERS = {op: reduce_converter(op) for op in REDUCTIONS}
