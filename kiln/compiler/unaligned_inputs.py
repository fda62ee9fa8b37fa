"""Which of a function's inputs the runtime may take in place at any address: those read only by Kiln's C kernels.

TVM's kernels may assume a tensor argument 64-byte aligned (its allocations are), so the runtime copies a caller's
array that is not (numpy's are 16-byte aligned) into a buffer of its own before each run. Kiln's C kernels
(kiln/schedules/kernels: the matmuls and attention) load with unaligned instructions, and their callers are loops of
`call_extern` with no TIR of their own, so an input read by nothing else needs no copy. The copy is most of what a
small GEMM's run adds to its kernel: 12-27 us of 170-400 for 32-77 x 768 x 768 on Zen 4, written from one core while
the other core's cache still holds the lines its kernel threads read last run (benchmarks/history.md). onnxruntime
reads the caller's array in place."""

from __future__ import annotations

import tvm
from tvm import relax

from ..schedules.kernels import C_KERNEL_ATTR


def unaligned_inputs(mod: tvm.IRModule, inputs: int, func: str = "main") -> list[int]:
    """Indices of `func`'s inputs (its first `inputs` parameters, as the runtime passes them: the weights follow,
    with or without a num_input attribute) whose every use is a tensor argument of a C kernel's caller. Any other use
    counts against it, a reshape included: the VM build may legalize one left at this stage into a kernel of TVM's.
    Names none where `func` is no Relax function (a module this analysis does not read): the runtime copies them."""
    f = mod[func] if func in mod else None
    if not isinstance(f, relax.Function):
        return []
    n = min(inputs, len(f.params))
    source = {p: i for i, p in enumerate(f.params[:n])}  # var -> the input it is
    safe = set(source.values())
    for block in f.body.blocks:
        for b in block.bindings:  # a VarBinding or a MatchCast: either way, a use of what its value names
            _check_use(mod, b.value, source, safe)
    for v in relax.analysis.free_vars(f.body.body):  # returned as it is: the caller's memory leaves the model
        safe.discard(source.get(v, -1))
    return sorted(safe)


def _check_use(mod, value, source: dict, safe: set) -> None:
    used = [v for v in relax.analysis.free_vars(value) if v in source]
    if not used:  # most bindings: no need to look at the callee (a walk of its TIR)
        return
    kernel_args = _c_kernel_args(mod, value)
    for v in used:
        if not any(a.same_as(v) for a in kernel_args) or _other_uses(value, v):
            safe.discard(source[v])


def _c_kernel_args(mod, value) -> list:
    """The tensor arguments of a call_tir to a C kernel's caller, [] for any other expression."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.call_tir"):
        return []
    callee = mod[value.args[0]]
    if not isinstance(callee, tvm.tirx.PrimFunc) or callee.attrs is None or C_KERNEL_ATTR not in callee.attrs:
        return []
    if _reads_buffers(callee):
        return []
    args = value.args[1]
    return list(args.fields) if isinstance(args, relax.Tuple) else [args]


def _other_uses(call, v) -> bool:
    """Whether v appears in the call_tir anywhere but its tensor arguments (its shape arguments, say)."""
    return any(v in relax.analysis.free_vars(a) for a in call.args[2:] if isinstance(a, relax.Expr))


LEAVES = frozenset({"Var", "IntImm", "FloatImm", "StringImm", "Buffer"})
BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max"})


def _reads_buffers(prim_func) -> bool:
    """Whether the PrimFunc might load or store a buffer itself (TVM's code, which may assume alignment) rather than
    only pass pointers to the C kernel: anything but loops, sequences, lets and calls over integer arithmetic
    counts as reading (TVM 0.27's Python has no TIR visitor, so the walk knows the few nodes a caller is made of)."""
    return _reads(prim_func.body)


def _reads(node) -> bool:
    kind = type(node).__name__
    if kind in LEAVES:
        return False
    if kind in BINARY:
        return _reads(node.a) or _reads(node.b)
    children = {
        "For": lambda: [node.min, node.extent, node.body],
        "SeqStmt": lambda: list(node.seq),
        "Evaluate": lambda: [node.value],
        "LetStmt": lambda: [node.value, node.body],
        "AttrStmt": lambda: [node.value, node.body],
        "Cast": lambda: [node.value],
        "Call": lambda: list(node.args),
    }.get(kind)
    return children is None or any(_reads(c) for c in children())
