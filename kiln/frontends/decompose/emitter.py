"""A tiny ONNX node emitter used by the decompositions: fresh unique names, constants as initializers."""

from __future__ import annotations

import contextvars

import numpy as np
import onnx

# the model decompose() is rewriting: rewrites that need element types (the interface passes shapes) read it
CURRENT_MODEL: contextvars.ContextVar = contextvars.ContextVar("kiln_decompose_model", default=None)


class Emitter:
    def __init__(self, prefix: str, consts: dict):
        self.prefix, self.consts, self.nodes, self._n = prefix, consts, [], 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{self.prefix}/{hint}_{self._n}"

    def const(self, value, hint: str = "c") -> str:
        name = self.name(hint)
        self.consts[name] = np.asarray(value)
        return name

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, out: str | None = None, **attrs) -> str:
        o = out or self.name(hint or op_type.lower())
        self.nodes.append(onnx.helper.make_node(op_type, inputs, [o], name=self.name(op_type), **attrs))
        return o

    # shorthands that avoid opset-dependent attributes (axes as inputs changed in opset 13)
    def reshape(self, x: str, shape) -> str:
        return self.op("Reshape", [x, self.const(np.array(shape, np.int64), "shape")])

    def slice(self, x: str, start: int, end: int, axis: int) -> str:
        c = lambda v: self.const(np.array([v], np.int64), "s")
        return self.op("Slice", [x, c(start), c(end), c(axis)])

    def take(self, x: str, index: int, axis: int = 0) -> str:
        """x[index] along axis, axis kept (size 1)."""
        return self.op("Gather", [x, self.const(np.array([index], np.int64), "idx")], axis=axis)
