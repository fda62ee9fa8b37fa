"""FoldConstants: compute at compile time every op whose inputs are all constants (shape
arithmetic, weight transposes, casts and reshapes of constants): in NumPy where it computes what
TVM's kernel would (numpy_fold.py: one LLVM build per op otherwise), then with TVM's FoldConstant.
`stats["constants_folded"]` counts the live op calls that became constants (TVM's FoldConstant
also drops dead bindings; those are not counted as folded).

TVM's FoldConstant half-legalizes a dynamic_strided_slice it cannot fold (a box head's slice to a
run-time RoI count): it leaves a call_tir to a shape function it never adds to the module, and a
later pass fails on the missing function. Those ops are legalized first, properly (LegalizeOps on
them alone), and a fold that still leaves a call to an undefined function is not kept."""

from __future__ import annotations

import tvm
from tvm import relax

from ...counters import Counter
from ..ir import calls
from . import numpy_fold
from .counting import count_calls
from .module_map import rewrite_calls

MISFOLDED = ("relax.dynamic_strided_slice",)  # ops TVM's FoldConstant leaves half-legalized
# TVM's FoldConstant legalizes every call it meets, constant or not, and topi has no identity for a bool max or min
# ("Cannot decide max_value for type bool": a valid opset-20 ReduceMin of a bool tensor lost the whole pass)
BOOL_REDUCE = {"relax.max": relax.op.max, "relax.min": relax.op.min}


def _bool_reduce_as_int8(builder, call):
    """max/min of a bool tensor as the same reduction of its int8 cast (any/all), cast back to bool."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name not in BOOL_REDUCE or str(call.args[0].ty.dtype) != "bool":
        return None
    x = builder.emit(relax.op.astype(call.args[0], "int8"))
    axis = None if call.attrs.axis is None else [int(a) for a in call.attrs.axis]
    reduced = builder.emit(BOOL_REDUCE[call.op.name](x, axis=axis, keepdims=bool(call.attrs.keepdims)))
    return relax.op.astype(reduced, "bool")


def _op_names(mod: tvm.IRModule) -> set[str]:
    return {
        c.op.name
        for _, f in mod.functions.items()
        if isinstance(f, relax.Function)
        for c in calls(f)
        if isinstance(c.op, tvm.ir.Op)
    }


def dangling_calls(mod: tvm.IRModule) -> list[str]:
    """Names of the functions main's calls refer to that the module does not define."""
    defined = {gv.name_hint for gv in mod.get_global_vars()}
    out = []
    for _, f in mod.functions.items():
        if not isinstance(f, relax.Function):
            continue
        for c in calls(f):
            for a in [c.op, *c.args]:
                if isinstance(a, tvm.ir.GlobalVar) and a.name_hint not in defined:
                    out.append(a.name_hint)
    return out


# what FoldConstants counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("constants_folded", int, "subgraphs over constants evaluated", always=True),)


@tvm.transform.module_pass(opt_level=1, name="FoldConstants")
class FoldConstants:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"constants_folded": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        ops = _op_names(mod)
        if ops & set(BOOL_REDUCE):
            mod, _ = rewrite_calls(mod, _bool_reduce_as_int8)
        if ops & set(MISFOLDED):
            mod = relax.transform.LegalizeOps(skip_ops=sorted(ops - set(MISFOLDED)))(mod)
        before = count_calls(relax.transform.DeadCodeElimination(["main"])(mod))
        folded = relax.transform.FoldConstant()(numpy_fold.fold(mod))
        if dangling_calls(folded):  # a fold TVM left half-done: the module as it was is correct
            return mod
        self.stats["constants_folded"] += before - count_calls(folded)
        return folded
