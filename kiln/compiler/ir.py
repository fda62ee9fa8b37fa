"""Read-only helpers over Relax IR that passes, the report and the schedules share: calls, variable
uses, op names, tensor sizes, the kernels a function calls. This module imports no pass (passes
import it), so it sits below every layer of the compiler.

Kiln's graph-level kernels (PrimFuncs a pass emits for one op, e.g. the Winograd convs) register
here what op they stand for, so the report can count them without importing the passes."""

from __future__ import annotations

import dataclasses
import math

import tvm
from tvm import relax
from tvm.ir.expr import GenericConst


@dataclasses.dataclass(frozen=True)
class KernelOp:
    """What a call_tir of one of Kiln's graph-level kernels stands for in the report."""

    prefix: str  # the PrimFunc name hint the pass gives (fused and renamed kernels start with it)
    op: str  # the op it counts as in op histograms, e.g. "nn.conv2d_winograd"
    convs: int = 0  # conv2d ops per call (conv_layouts counts them)


KERNEL_OPS: dict[str, KernelOp] = {}


def register_kernel(prefix: str, op: str, convs: int = 0) -> str:
    """A pass names the PrimFuncs it emits and the op they count as; returns `prefix` (the pass's
    name hint). The longest registered prefix a kernel's name starts with wins."""
    KERNEL_OPS[prefix] = KernelOp(prefix, op, convs)
    return prefix


def calls(func) -> list[relax.Call]:
    """Every call in a Relax function's body, in post order."""
    found = []
    relax.analysis.post_order_visit(func.body, lambda e: found.append(e) if isinstance(e, relax.Call) else None)
    return found


def out_dtype(attrs) -> str | None:
    """A conv/matmul call's out_dtype attribute, None where it is unset (TVM spells that "", "void" or "None")."""
    return None if str(attrs.out_dtype) in ("", "void", "None") else str(attrs.out_dtype)


def ints(values) -> list[int]:
    """An attribute's or a static shape's values (TVM IntImms, Array entries) as Python ints."""
    return [int(v) for v in values]


def op_name(e) -> str | None:
    """The name of the op a Relax call calls (e.g. "relax.add"), else None."""
    return e.op.name if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None


def clip_bounds(value) -> tuple[float, float] | None:
    """(lo, hi) of a relax.clip with constant bounds (FloatImm or IntImm), else None."""
    if op_name(value) == "relax.clip" and all(
        isinstance(a, tvm.tirx.FloatImm | tvm.tirx.IntImm) for a in value.args[1:3]
    ):
        return float(value.args[1].value), float(value.args[2].value)
    return None


def scalar_value(e) -> float | None:
    """The value of a one-element constant, else None."""
    if isinstance(e, GenericConst) and e.value.numpy().size == 1:
        return float(e.value.numpy().reshape(()))
    return None


def var_uses(func: relax.Function) -> dict:
    """How many times each Relax variable is referenced in the function's body (its uses)."""
    counts: dict = {}

    def visit(e):
        if isinstance(e, relax.Var):
            counts[e] = counts.get(e, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def module_var_uses(mod) -> dict:
    """var_uses over every Relax function of a module."""
    uses: dict = {}
    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            uses |= var_uses(f)
    return uses


def var_users(bindings) -> dict:
    """Var -> indices of the bindings (in order) whose call reads it as an argument."""
    users: dict = {}
    for i, b in enumerate(bindings):
        if isinstance(b.value, relax.Call):
            for v in dict.fromkeys(a for a in b.value.args if isinstance(a, relax.Var)):
                users.setdefault(v, []).append(i)
    return users


def kiln_kernel(call) -> KernelOp | None:
    """The registered op a call_tir of one of Kiln's graph-level kernels stands for, else None."""
    if op_name(call) != "relax.call_tir":
        return None
    name = call.args[0].name_hint
    found = [k for k in KERNEL_OPS.values() if name.startswith(k.prefix)]
    return max(found, key=lambda k: len(k.prefix)) if found else None


def kernels(mod: tvm.IRModule, func: str = "main") -> list[str]:
    """The compiled kernels `func` calls, in call order (one entry per call_tir)."""
    return [str(c.args[0].name_hint) for c in calls(mod[func]) if op_name(c) == "relax.call_tir"]


def numel(ty) -> int:
    """Elements of a tensor type; 0 where a dim is symbolic or the shape is unknown (or not a tensor)."""
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        try:
            return math.prod(int(v) for v in ty.shape.values)  # Python ints: no overflow
        except (TypeError, ValueError, AttributeError):  # a symbolic dim, or a shape held in a variable
            return 0
    return 0


def nbytes(ty) -> int:
    """Bytes of a tensor (or tuple) type; 0 where a dim is symbolic or the shape is unknown."""
    if isinstance(ty, relax.TensorType):
        n = numel(ty)
        return n * tvm.runtime.DataType(ty.dtype).bits // 8 if n else 0
    if isinstance(ty, relax.TupleType):
        return sum(nbytes(f) for f in ty.fields)
    return 0
