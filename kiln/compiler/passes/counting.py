"""Shared by Kiln's passes: each records what it did in `self.stats`, which the report reads."""
from __future__ import annotations

import tvm
from tvm import relax

from ..analysis import _calls


def count_calls(mod: tvm.IRModule) -> int:
    """Op calls (not calls to functions) in every Relax function of the module."""
    return sum(isinstance(c.op, tvm.ir.Op) for _, f in mod.functions.items() if isinstance(f, relax.Function) for c in _calls(f))


def static_shape(e) -> tuple | None:
    """The static shape of a Relax expression's tensor type, or None."""
    ty = e.ty
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        try:
            return tuple(int(v) for v in ty.shape.values)
        except TypeError:
            return None
    return None
