"""The loop the rewriting passes share: apply a rewrite to every Relax function of a module that
is not a fused primitive, into a copy (never mutate the caller's module)."""
from __future__ import annotations

from typing import Callable

import tvm
from tvm import relax


def rewrite_functions(mod: tvm.IRModule, rewrite: Callable[[relax.Function], relax.Expr]) -> tvm.IRModule:
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, f in list(mod.functions.items()):
        if isinstance(f, relax.Function) and "Primitive" not in (f.attrs or {}):
            out[gv] = rewrite(f)
    return out
