"""Shared by Kiln's passes: each records what it did in `self.stats`, which the report reads."""
from __future__ import annotations

import tvm
from tvm import relax

from ..analysis import _calls


def count_calls(mod: tvm.IRModule) -> int:
    """Op calls (not calls to functions) in every Relax function of the module."""
    return sum(isinstance(c.op, tvm.ir.Op) for _, f in mod.functions.items() if isinstance(f, relax.Function) for c in _calls(f))
