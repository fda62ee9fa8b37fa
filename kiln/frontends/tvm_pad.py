"""Pad whose pads are fed at run time (TVM 0.27's converter takes only constant pads: "Dynamic pads are not
supported yet"), which also takes CenterCropPad with a run-time shape (its function body pads and slices by
amounts computed from that shape). The input's rank is pinned and the pads' length static, so each padded
axis's output length n + begin + end is a symbolic dim bound per run. Each padded axis is a gather at the
source index of every output position (o - begin), mapped into the input by the mode: constant reads the
clamped index and a mask of the positions outside the input takes the fill value (itself a constant or a
run-time input); edge clamps; reflect mirrors about the edge pixels (period 2(n - 1)); wrap takes the index
modulo n. Negative pads (crops) are the same gather with begin < 0, the modes then reading within what the
crop leaves, as onnxruntime does (onnx's reference, np.pad, takes no negative pads). The axes input stays a
constant."""

from __future__ import annotations

from ..errors import UnsupportedModelError
from .tvm_dynamic_shapes import dims_of, i64, runtime_dims, runtime_tensor, static_length


def _source_index(i, n, mode: str):
    """Where output positions with source index i (int64, any integer) read from an axis of length n."""
    from tvm import relax

    op = relax.op
    last = op.maximum(op.subtract(n, i64(1)), i64(0))
    if mode == "wrap":
        return op.floor_mod(i, op.maximum(n, i64(1)))
    if mode == "reflect":
        period = op.maximum(op.multiply(last, i64(2)), i64(1))
        j = op.floor_mod(i, period)
        return op.where(op.greater(j, last), op.subtract(period, j), op.minimum(j, last))
    return op.minimum(op.maximum(i, i64(0)), last)  # edge, and constant (masked afterwards)


def runtime_pad(bb, x, pads, value, axes: list[int], mode: str, node: str):
    """x padded by the int (2 * len(axes),) tensor pads on `axes`."""
    from tvm import relax

    op = relax.op
    rank = x.ty.ndim
    pads = bb.normalize(op.astype(pads, "int64"))
    dims = dims_of(bb, x)

    def take(t, k: int):
        return bb.normalize(op.take(t, relax.const(k, "int64"), axis=0))

    begins = [take(pads, p) for p in range(len(axes))]
    lengths = [take(dims, a) for a in axes]
    outs = [op.add(op.add(n, b), take(pads, p + len(axes))) for p, (n, b) in enumerate(zip(lengths, begins))]
    outs = runtime_dims(bb, bb.normalize(op.concat([op.reshape(o, [1]) for o in outs], axis=0)), len(axes), "pad")
    y, inside = x, None
    for p, (a, n, b, m) in enumerate(zip(axes, lengths, begins, outs)):
        # a negative pad crops first (onnxruntime's order): the other mode reads within what is left, [lo, hi)
        lo = bb.normalize(op.maximum(op.negative(b), i64(0)))
        hi = bb.normalize(op.add(n, op.minimum(take(pads, p + len(axes)), i64(0))))
        i = bb.normalize(op.subtract(op.subtract(op.arange(0, m, 1, "int64"), b), lo))
        src = op.add(_source_index(i, op.subtract(hi, lo), mode), lo)
        y = bb.normalize(op.take(y, bb.normalize(src), axis=a))
        if mode == "constant":
            shape = [1] * rank
            shape[a] = m
            ok = op.logical_and(op.greater_equal(i, i64(0)), op.less(op.add(i, lo), hi))
            ok = op.reshape(ok, relax.ShapeExpr(shape))
            inside = ok if inside is None else op.logical_and(inside, ok)
    if inside is None:
        return y
    fill = relax.const(0, x.ty.dtype) if value is None else op.astype(op.reshape(value, []), x.ty.dtype)
    return op.where(bb.normalize(inside), y, fill)


def pad_converter():
    import tvm
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Pad(f.Pad):
        @classmethod
        def _runtime(cls, bb, inputs, attr, params):
            x, node = inputs[0], attr["tvm_custom"]["name"] or "(unnamed)"
            rank = x.ty.ndim
            axes = list(range(rank))
            if len(inputs) > 3 and inputs[3] is not None:
                c = f.get_constant(inputs[3], params)
                if not isinstance(c, tvm.ir.GenericConst):
                    raise UnsupportedModelError(
                        f"Pad node {node!r}: its axes are fed at run time",
                        where="Pad",
                        fix="export the axes as a constant, or freeze that input (--freeze-input NAME=VALUE)",
                    )
                axes = [int(v) % rank for v in c.value.numpy().reshape(-1)]
            if static_length(inputs[1], "Pad", node) != 2 * len(axes):
                raise UnsupportedModelError(
                    f"Pad node {node!r}: {static_length(inputs[1], 'Pad', node)} pads for {len(axes)} axes",
                    where="Pad",
                    fix="give two pads (begin, end) per padded axis",
                )
            mode = attr.get("mode", b"constant")
            mode = mode.decode("ascii") if isinstance(mode, bytes) else mode
            value = inputs[2] if len(inputs) > 2 else None
            return runtime_pad(bb, x, inputs[1], value, axes, mode, node)

        @classmethod
        def _impl_v11(cls, bb, inputs, attr, params):
            if runtime_tensor(inputs[1], params):
                return cls._runtime(bb, inputs, attr, params)
            return super()._impl_v11(bb, inputs, attr, params)

        @classmethod
        def _impl_v18(cls, bb, inputs, attr, params):
            if runtime_tensor(inputs[1], params):
                return cls._runtime(bb, inputs, attr, params)
            return super()._impl_v18(bb, inputs, attr, params)

        @classmethod
        def _impl_v19(cls, bb, inputs, attr, params):
            if runtime_tensor(inputs[1], params):
                return cls._runtime(bb, inputs, attr, params)
            return super()._impl_v19(bb, inputs, attr, params)

    return Pad
