"""Which activation a run of elementwise bindings computes, found by its values rather than its spelling.

Exporters spell GELU many ways: the TorchScript exporter's x * (erf(x / sqrt 2) + 1) * 0.5, the dynamo
exporter's 0.5 * x * (...), GPT-2's tanh form with pow(x, 3), Relax's own nn.gelu; each with its own operand
order. Matching every spelling as a pattern is a table that is never complete. Instead: the bindings after a
value x that read only x, each other and scalar constants form a region; when exactly one of its values is read
outside it, the region is a function of x, evaluated here in float64 on points over [-8, 8] and compared with
each activation a fused kernel implements (to 2e-5: the erf and tanh forms of GELU differ by up to 5e-4)."""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.ir.expr import GenericConst

from ..ir import op_name

SCAN = 16  # bindings after x searched for the region
TOLERANCE = 2e-5
POINTS = np.concatenate([np.linspace(-8.0, 8.0, 1601), [-1e-3, 1e-3, 0.5, -0.5]])
_erf = np.vectorize(math.erf)
ACTIVATIONS = {
    "gelu_erf": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: np.maximum(x, 0.0),
}
UNARY = {
    "relax.erf": _erf,
    "relax.tanh": np.tanh,
    "relax.sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)),
    "relax.sqrt": np.sqrt,
    "relax.negative": np.negative,
    "relax.nn.relu": lambda a: np.maximum(a, 0.0),
    "relax.nn.gelu": ACTIVATIONS["gelu_erf"],
    "relax.nn.gelu_tanh": ACTIVATIONS["gelu_tanh"],
}
BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.power": np.power,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
}


def _scalar(e) -> float | None:
    """The value of a one-element float constant, else None."""
    if isinstance(e, GenericConst) and e.value.numpy().size == 1 and "float" in str(e.value.dtype):
        return float(e.value.numpy().reshape(()))
    return None


def _takes(value, inside: set) -> bool:
    """An elementwise op whose operands are values of the region or scalar constants, one at least a value."""
    name = op_name(value)
    if name not in UNARY and name not in BINARY:
        return False
    args = list(value.args)
    if len(args) != (1 if name in UNARY else 2):
        return False
    ok = [isinstance(a, relax.Var) and a in inside or _scalar(a) is not None for a in args]
    return all(ok) and any(isinstance(a, relax.Var) and a in inside for a in args)


def region(bindings, start: int, x, uses: dict, claimed: set) -> tuple[list[int], object] | None:
    """(binding indices, the value read outside) of the elementwise region after binding `start` that computes
    a function of x alone, x read nowhere else, else None (no region, or more than one value leaves it). The
    indices are those `out` depends on; any other binding of the region is read by none outside it (dead)."""
    inside, taken = {x}, []
    for j in range(start + 1, min(len(bindings), start + 1 + SCAN)):
        if j not in claimed and isinstance(bindings[j].value, relax.Call) and _takes(bindings[j].value, inside):
            inside.add(bindings[j].var)
            taken.append(j)
    inner: dict = {}
    for j in taken:
        for a in bindings[j].value.args:
            if isinstance(a, relax.Var):
                inner[a] = inner.get(a, 0) + 1
    leaving = [v for v in inside if uses.get(v, 0) > inner.get(v, 0)]
    if len(leaving) != 1 or leaving[0].same_as(x):
        return None
    return _ancestors(bindings, taken, leaving[0]), leaving[0]


def _ancestors(bindings, taken: list[int], out) -> list[int]:
    """The region's bindings that `out` depends on, in order."""
    by_var = {bindings[j].var: j for j in taken}
    need, stack = set(), [out]
    while stack:
        v = stack.pop()
        j = by_var.get(v)
        if j is None or j in need:
            continue
        need.add(j)
        stack += [a for a in bindings[j].value.args if isinstance(a, relax.Var)]
    return sorted(need)


def evaluate(bindings, indices: list[int], x, out, points=POINTS) -> np.ndarray:
    """The region's value `out` for x = points, in float64."""
    env = {x: np.asarray(points, np.float64)}
    for j in indices:
        value = bindings[j].value
        args = [env[a] if isinstance(a, relax.Var) else _scalar(a) for a in value.args]
        name = op_name(value)
        with np.errstate(all="ignore"):
            env[bindings[j].var] = UNARY[name](args[0]) if name in UNARY else BINARY[name](args[0], args[1])
    return env[out]


def identify(bindings, indices: list[int], x, out) -> str | None:
    """The name (a key of ACTIVATIONS) of the activation the region computes, else None."""
    got = evaluate(bindings, indices, x, out)
    for name, f in ACTIVATIONS.items():
        want = f(POINTS)
        if np.all(np.isfinite(got)) and np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))) < TOLERANCE:
            return name
    return None


def activation_after(
    bindings, start: int, uses: dict, claimed: set, names=None
) -> tuple[str, list[int], object] | None:
    """(activation's name, its bindings, the value it produces) where binding `start`'s value goes through an
    activation region alone (of `names`, where given), else None: what the kernels' epilogue passes fuse."""
    x = bindings[start].var
    found = region(bindings, start, x, uses, claimed)
    if found is None or (name := identify(bindings, found[0], x, found[1])) is None:
        return None
    return (name, *found) if names is None or name in names else None
