"""Static upper bounds of the symbolic dims Kiln's converters make during one import (NonZero's count,
TopK's k, a match-cast of a shapeless tensor): tirx.Var -> int. Read where an allocation must be sized
ahead of time (NMS's selected rows); cleared by tvm_converters.kiln_converters around each import."""

from __future__ import annotations

BOUNDS: dict = {}


def bound(var, of) -> None:
    """Record var <= the static upper bound of the dim `of` (an int or an expression of bounded vars)."""
    b = upper(of)
    if b is not None:
        BOUNDS[var] = b


def upper(expr) -> int | None:
    import tvm

    if isinstance(expr, int):
        return expr
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr.value)
    from tvm.sym import Analyzer

    ana = Analyzer()
    for v, b in BOUNDS.items():
        ana.bind(v, tvm.ir.Range.from_min_extent(tvm.tirx.const(0, "int64"), tvm.tirx.const(b + 1, "int64")))
    r = ana.const_int_bound(expr)
    return int(r.max_value) if r.max_value < (1 << 62) else None
