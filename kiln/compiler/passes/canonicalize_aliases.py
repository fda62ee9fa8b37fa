"""CanonicalizeAliases: TVM's CanonicalizeBindings on a module whose shapes are all static, before FuseOps. The layout
passes leave `a = b` aliases, and FuseOps does not look through them: an int8 residual's dequantize (Int8Residuals)
ran as a kernel of its own that wrote float32 (timings in benchmarks/history.md). On a module with run-time sizes
(AffineGrid, Resize with run-time scales) TVM's pass left FuseTIR failing (a symbolic variable remapped twice), so
those keep their aliases. `stats["aliases_canonicalized"]`: 1 where it ran."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter


def _static(mod: tvm.IRModule) -> bool:
    """Every Relax function's shapes are static (no symbolic variable anywhere in them)."""
    return all(
        not relax.analysis.defined_symbolic_vars(f) and not relax.analysis.free_symbolic_vars(f)
        for f in mod.functions.values()
        if isinstance(f, relax.Function)
    )


# what CanonicalizeAliases counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("aliases_canonicalized", int, "1 where TVM's CanonicalizeBindings ran before FuseOps (static shapes)"),
)


@tvm.transform.module_pass(opt_level=1, name="CanonicalizeAliases")
class CanonicalizeAliases:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"aliases_canonicalized": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        if not _static(mod):
            return mod
        self.stats["aliases_canonicalized"] = 1
        return relax.transform.CanonicalizeBindings()(mod)
