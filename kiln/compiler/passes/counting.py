"""Shared by Kiln's passes: each records what it did in `self.stats`, which the report reads."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ..ir import calls

REDUCED_TYPES = {
    "fp16": ("float16", np.float16),
    "bf16": ("bfloat16", ml_dtypes.bfloat16),
}  # --precision: (TVM, numpy) type


def count_calls(mod: tvm.IRModule) -> int:
    """Op calls (not calls to functions) in every Relax function of the module."""
    return sum(
        isinstance(c.op, tvm.ir.Op) for _, f in mod.functions.items() if isinstance(f, relax.Function) for c in calls(f)
    )


def float32_conv(call) -> bool:
    """A relax conv2d of float32 data by constant float32 weights, with a float32 (or unset) out_dtype:
    what the passes that rewrite convs into Kiln's own kernels can take."""
    return (
        isinstance(call.op, tvm.ir.Op)
        and call.op.name == "relax.nn.conv2d"
        and isinstance(call.args[1], GenericConst)
        and str(call.args[0].ty.dtype) == "float32"
        and str(call.args[1].ty.dtype) == "float32"
        and str(call.attrs.out_dtype) in ("float32", "", "void", "None")
    )


def nchwc_block(layout: str) -> int | None:
    """c of an NCHW{c}c layout string, else None."""
    if layout.startswith("NCHW") and layout.endswith("c") and layout[4:-1].isdigit():
        return int(layout[4:-1])
    return None


def static_shape(e) -> tuple | None:
    """The static shape of a Relax expression's tensor type, or None."""
    ty = e.ty
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        try:
            return tuple(int(v) for v in ty.shape.values)
        except TypeError:
            return None
    return None


def float32_shape(e) -> list[int] | None:
    """The static shape of a float32 tensor expression, or None (another dtype, or a dimension known at run time)."""
    ty = e.ty
    if not isinstance(ty, relax.TensorType) or str(ty.dtype) != "float32":
        return None
    shape = static_shape(e)
    return None if shape is None else list(shape)


def bound_call(e, lookup_binding, op: str | None = None):
    """The op call a Var is bound to (through var aliases), or None; with `op`, only a call of that op."""
    while isinstance(e, relax.Var):
        e = lookup_binding(e)
    if not (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)):
        return None
    return e if op is None or e.op.name == op else None
