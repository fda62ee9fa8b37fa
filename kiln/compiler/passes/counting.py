"""Shared by Kiln's passes: each records what it did in `self.stats`, which the report reads."""
from __future__ import annotations

import tvm
from tvm import relax


def count_calls(mod: tvm.IRModule) -> int:
    n = 0
    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            calls = []
            relax.analysis.post_order_visit(f.body, lambda e: calls.append(1) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
            n += len(calls)
    return n
