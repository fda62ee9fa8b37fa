"""Constant folding in NumPy, ahead of TVM's FoldConstant, for the ops whose result NumPy computes
exactly as TVM's kernel would: layout ops (transposes, reshapes, layout_transform's index maps),
NaN tests, selection, comparisons and float elementwise arithmetic.

Why: TVM's FoldConstant legalizes each foldable call and compiles it with LLVM, one build per
distinct kernel. A compile spent most of its time there: MobileNetV2's importer wraps each ReLU6
bound in where(isnan(c), -inf, c), 140 builds; ResNet-50's NCHWc weights are 104 layout_transforms
(timings in benchmarks/history.md). Here
each is a NumPy call. Whatever is left (an op not in the table, a layout_transform with padding and
no pad value, a dtype NumPy lacks) stays for FoldConstant, so the result is the same either way.

Not a pass of the pipeline: FoldConstants and ConvertLayout call fold() before FoldConstant."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.expr import GenericConst

from .module_map import CallRewriter, rewrite_functions

FLOATS = ("float16", "float32", "float64")
NUMPY_DTYPES = FLOATS + ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


class NotFoldable(Exception):
    """This call is left to TVM's FoldConstant."""


def _index(expr, env: dict) -> np.ndarray:
    """A layout map's index expression over integer index arrays (all indices are non-negative, so
    floordiv/floormod are NumPy's // and %)."""
    if isinstance(expr, tirx.Var):
        return env[expr]
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    binary = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply}
    binary.update({tirx.FloorDiv: np.floor_divide, tirx.FloorMod: np.mod})
    for kind, f in binary.items():
        if isinstance(expr, kind):
            return f(_index(expr.a, env), _index(expr.b, env))
    raise NotFoldable(f"index expression {type(expr).__name__}")


def _layout_transform(call, x: np.ndarray, shape: tuple) -> np.ndarray:
    attrs = call.attrs
    im = attrs.index_map
    if getattr(attrs, "axis_separators", None) or getattr(attrs, "input_axis_separators", None):
        raise NotFoldable("axis separators")
    grid = np.indices(x.shape, dtype=np.int64)
    env = {v: grid[k] for k, v in enumerate(im.initial_indices)}
    where = tuple(np.broadcast_to(_index(e, env), x.shape) for e in im.final_indices)
    if int(np.prod(shape)) == x.size:
        out = np.empty(shape, x.dtype)
    elif attrs.pad_value is not None:
        out = np.full(shape, attrs.pad_value.value, x.dtype)
    else:  # padding whose value TVM leaves to its kernel
        raise NotFoldable("padding without a pad value")
    out[where] = x
    return out


UNARY = {"isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "logical_not": np.logical_not}
COMPARE = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
}
ARITH = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "negative": np.negative,
    "abs": np.abs,
}
RESHAPES = ("reshape", "expand_dims", "squeeze", "flatten")


def _evaluate(call, args: list[np.ndarray], shape: tuple, dtype: str) -> np.ndarray:
    name = call.op.name.removeprefix("relax.")
    if name in UNARY:
        return UNARY[name](args[0])
    if name in COMPARE:
        return COMPARE[name](*args)
    if name in ARITH:  # one IEEE operation per element: the same result as the kernel's
        if any(a.dtype.name not in FLOATS for a in args) or dtype not in FLOATS:
            raise NotFoldable("integer arithmetic")
        return ARITH[name](*args)
    if name == "where":
        return np.where(*args)
    if name in RESHAPES:
        return args[0].reshape(shape)
    if name == "permute_dims":
        axes = call.attrs.axes
        return np.transpose(args[0], None if axes is None else [int(a) for a in axes])
    if name == "layout_transform":
        return _layout_transform(call, args[0], shape)
    if name == "astype":  # exact: to a float from anything, or between integers and bools
        if dtype not in FLOATS and args[0].dtype.name in FLOATS:
            raise NotFoldable("float to integer")
        return args[0].astype(dtype)
    raise NotFoldable(name)


def _static(ty) -> tuple[tuple, str]:
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        raise NotFoldable("dynamic shape")
    dims = tuple(int(v) if isinstance(v, tirx.IntImm) else None for v in shape.values)
    if None in dims or str(ty.dtype) not in NUMPY_DTYPES:
        raise NotFoldable("shape or dtype")
    return dims, str(ty.dtype)


def _rewrite(builder, call, lookup):
    if not isinstance(call.op, tvm.ir.Op):
        return None
    args = []
    for a in call.args:
        if isinstance(a, relax.ShapeExpr) and call.op.name == "relax.reshape":
            continue  # the target shape: the call's own type says it
        c = lookup(a) if isinstance(a, relax.Var) else a
        if not isinstance(c, GenericConst) or not hasattr(c.value, "numpy"):
            return None
        args.append(c.value.numpy())
    if not args:
        return None
    try:
        shape, dtype = _static(call.ty)
        out = np.asarray(_evaluate(call, args, shape, dtype))
    except NotFoldable:
        return None
    if out.shape != shape:
        return None
    return relax.const(np.array(out, dtype=dtype, order="C"), dtype)  # (np.ascontiguousarray makes 0-d 1-d)


def fold(mod: tvm.IRModule) -> tvm.IRModule:
    """Every call NumPy can fold replaced by its constant (repeated until none is left: a folded
    call's users may fold next), unused bindings removed."""
    while True:
        rewriters = []

        def one(f, mod=mod, rewriters=rewriters):
            rewriters.append(CallRewriter(mod, _rewrite, lookup=True))
            return rewriters[-1].visit_expr(f)

        out = rewrite_functions(mod, one)
        if not sum(r.count for r in rewriters):
            return mod  # as it came: the mutator's copy of an unchanged function is not always the same
        mod = relax.transform.DeadCodeElimination(["main"])(out)
