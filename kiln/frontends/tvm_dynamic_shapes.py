"""Reshape and Expand whose target shape is a run-time tensor (TVM 0.27's converters take only constants
and shape expressions: "Reshape requires the input new shape to be Shape"). The shape tensor's length is
static once inputs are pinned, so the output's rank is known: its dims become symbolic (tensor_to_shape,
match_cast to fresh dims, as TopK's k in tvm_converters.py) and the VM sizes the output per run, with
ONNX's rules applied to the values at run time (Reshape's 0 and -1, Expand's broadcast). A shape the data
cannot take (element counts that differ, dims that do not broadcast) is a run-time input error, checked
before the kernel reads anything. A shape tensor of run-time length (the output's rank unknown) is refused."""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..runtime.model import INPUT_CHECK


def runtime_tensor(x, params) -> bool:
    """x is a tensor computed at run time (not a constant, not a shape expression)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    if x is None or isinstance(f.get_constant(x, params), tvm.ir.GenericConst):
        return False
    return isinstance(getattr(x, "ty", None), relax.TensorType)


def static_length(x, op: str, node: str) -> int:
    """The length of a 1-D run-time shape/axes tensor; refused when it is known only at run time."""
    ty = x.ty
    dims = ty.shape.values if ty.shape is not None else None
    if dims is not None and len(dims) == 1 and hasattr(dims[0], "value"):
        return int(dims[0].value)
    raise UnsupportedModelError(
        f"{op} node {node!r}: its shape/axes input {ty} has a length known only at run time, so the output's "
        "rank is not known ahead of time",
        where=op,
        fix="pin the inputs it is computed from with --input-shape, or freeze it with --freeze-input NAME=VALUE",
    )


def runtime_dims(bb, shape, n: int, hint: str) -> list:
    """The values of an int64 (n,) tensor as n fresh symbolic dims, bound at run time."""
    import tvm
    from tvm import relax

    sh = bb.normalize(relax.op.tensor_to_shape(shape))
    dims = [tvm.tirx.Var(f"{hint}{i}", "int64") for i in range(n)]
    bb.match_cast(sh, relax.ShapeType(dims))
    return dims


def check(bb, ok, message: str) -> None:
    """A run-time check of a bool tensor (all true), reported as an input error when it fails."""
    from tvm import relax

    ok = bb.normalize(relax.op.reshape(relax.op.min(relax.op.astype(ok, "int32")), []))
    ok = bb.normalize(relax.op.astype(ok, "bool"))
    bb.emit(relax.op.assert_op(ok, format=f"{INPUT_CHECK} {message}".replace("{", "(").replace("}", ")")))


def i64(values):
    import numpy as np
    from tvm import relax

    return relax.const(np.asarray(values, np.int64), "int64")


def dims_of(bb, data):
    from tvm import relax

    return bb.normalize(relax.op.shape_to_tensor(relax.op.shape_of(data)))


def _reshape_target(bb, data, shape, n: int, allowzero: int):
    """ONNX Reshape's target shape at run time: 0 copies the input's dim (unless allowzero), -1 is inferred."""
    from tvm import relax

    dims, r = dims_of(bb, data), data.ty.ndim
    s = bb.normalize(relax.op.astype(shape, "int64"))
    if not allowzero and r > 0:
        k = min(n, r)
        head = bb.normalize(relax.op.strided_slice(dims, [0], [0], [k]))
        same = head if n == k else bb.normalize(relax.op.concat([head, i64([0] * (n - k))], axis=0))
        s = bb.normalize(relax.op.where(relax.op.equal(s, i64(0)), same, s))
    numel = bb.normalize(relax.op.prod(dims)) if r > 0 else i64(1)
    unknown = bb.normalize(relax.op.equal(s, i64(-1)))
    known = bb.normalize(relax.op.prod(relax.op.where(unknown, i64(1), s)))
    inferred = relax.op.floor_divide(numel, relax.op.maximum(known, i64(1)))
    return bb.normalize(relax.op.where(unknown, inferred, s)), numel


def reshape_converter():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Reshape(f.Reshape):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            data, shape = inputs[0], inputs[1]
            if not runtime_tensor(shape, params) or not isinstance(getattr(data, "ty", None), relax.TensorType):
                return super()._impl_v13(bb, inputs, attr, params)
            node = attr["tvm_custom"]["name"] or "(unnamed)"
            n = static_length(shape, "Reshape", node)
            target, numel = _reshape_target(bb, data, shape, n, attr.get("allowzero", 0))
            check(
                bb,
                relax.op.equal(relax.op.prod(target), numel),
                f"Reshape node {node!r}: the shape fed at run time does not hold the input's elements",
            )
            return relax.op.reshape(data, relax.ShapeExpr(runtime_dims(bb, target, n, "reshape")))

    return Reshape


def expand_converter():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Expand(f.Expand):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            data, shape = inputs[0], inputs[1]
            if not runtime_tensor(shape, params) or not isinstance(getattr(data, "ty", None), relax.TensorType):
                return super()._impl_v13(bb, inputs, attr, params)
            node = attr["tvm_custom"]["name"] or "(unnamed)"
            n, r = static_length(shape, "Expand", node), data.ty.ndim
            m = max(n, r)
            dims = dims_of(bb, data)
            if m > r:
                dims = bb.normalize(relax.op.concat([i64([1] * (m - r)), dims], axis=0))
            s = bb.normalize(relax.op.astype(shape, "int64"))
            if m > n:
                s = bb.normalize(relax.op.concat([i64([1] * (m - n)), s], axis=0))
            out = bb.normalize(relax.op.where(relax.op.equal(s, i64(1)), dims, s))
            fits = relax.op.logical_or(relax.op.equal(dims, i64(1)), relax.op.equal(dims, out))
            check(bb, fits, f"Expand node {node!r}: the shape fed at run time does not broadcast with the input's")
            return relax.op.broadcast_to(data, relax.ShapeExpr(runtime_dims(bb, out, m, "expand")))

    return Expand


def _slices(bb, data, axis: int, bounds: list):
    """data cut along axis at bounds (ints or symbolic dims): len(bounds) - 1 pieces, as a tuple."""
    from tvm import relax

    return relax.Tuple(
        [
            bb.normalize(relax.op.strided_slice(data, [axis], [b], [e], assume_inbound=True))
            for b, e in zip(bounds[:-1], bounds[1:])
        ]
    )


def split_converter():
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Split(f.Split):
        """Split sizes fed at run time (pieces of symbolic length), and constant sizes with a zero among them
        (TVM's split takes only increasing indices: LegalizeOps failed "split_indices must be increasing")."""

        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            data, sizes = inputs[0], inputs[1] if len(inputs) > 1 else None
            if sizes is None or not isinstance(getattr(data, "ty", None), relax.TensorType):
                return super()._impl_v13(bb, inputs, attr, params)
            axis = attr.get("axis", 0) % data.ty.ndim
            c = f.get_constant(sizes, params)
            if isinstance(c, tvm.ir.GenericConst):
                values = c.value.numpy().reshape(-1).astype(np.int64)
                if len(values) < 2 or values.min() > 0:
                    return super()._impl_v13(bb, inputs, attr, params)
                return _slices(bb, data, axis, [0, *np.cumsum(values).tolist()])
            if not runtime_tensor(sizes, params):
                return super()._impl_v13(bb, inputs, attr, params)
            node = attr["tvm_custom"]["name"] or "(unnamed)"
            n = static_length(sizes, "Split", node)
            s = bb.normalize(relax.op.astype(sizes, "int64"))
            ends = bb.normalize(relax.op.cumsum(s, axis=0))
            dim = bb.normalize(relax.op.take(dims_of(bb, data), relax.const(axis, "int64"), axis=0))
            fits = relax.op.logical_and(
                relax.op.equal(relax.op.take(ends, relax.const(n - 1, "int64"), axis=0), dim),
                relax.op.greater_equal(relax.op.min(s), i64(0)),
            )
            check(bb, fits, f"Split node {node!r}: the sizes fed at run time do not add up to the axis' length")
            bounds = runtime_dims(bb, bb.normalize(relax.op.concat([i64([0]), ends], axis=0)), n + 1, "split")
            return _slices(bb, data, axis, bounds)

    return Split


def tile_converter():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Tile(f.Tile):
        """Repeats fed at run time: x [d0, d1, ...] as [1, d0, 1, d1, ...], broadcast to [r0, d0, r1, d1, ...]
        and merged to [r0 * d0, r1 * d1, ...], the repeats symbolic dims."""

        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            data, reps = inputs[0], inputs[1]
            ty = getattr(data, "ty", None)
            if not runtime_tensor(reps, params) or not isinstance(ty, relax.TensorType) or ty.shape is None:
                return super()._impl_v13(bb, inputs, attr, params)
            node = attr["tvm_custom"]["name"] or "(unnamed)"
            dims, r = list(ty.shape.values), ty.ndim
            if static_length(reps, "Tile", node) != r:
                raise UnsupportedModelError(
                    f"Tile node {node!r}: {static_length(reps, 'Tile', node)} repeats for a rank-{r} input",
                    where="Tile",
                    fix="check the model: ONNX takes one repeat per input dim",
                )
            reps = bb.normalize(relax.op.astype(reps, "int64"))
            # a negative repeat sized the output negative: std::bad_alloc, reported as a Kiln bug
            check(bb, relax.op.greater_equal(reps, i64(0)), f"Tile node {node!r}: a repeat is negative")
            rv = runtime_dims(bb, reps, r, "tile")
            spread = relax.op.reshape(data, [v for d in dims for v in (1, d)])
            wide = relax.op.broadcast_to(spread, relax.ShapeExpr([v for k, d in zip(rv, dims) for v in (k, d)]))
            return relax.op.reshape(wide, relax.ShapeExpr([k * d for k, d in zip(rv, dims)]))

    return Tile
