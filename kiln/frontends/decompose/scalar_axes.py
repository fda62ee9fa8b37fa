"""Unsqueeze whose axes input is a rank-0 constant (onnx's own function bodies write one: the
expanded AffineGrid's Unsqueeze(grid, -1)); onnxruntime takes it as one axis, TVM 0.27's converter
iterates over it ("'int' object is not iterable"). Rewritten with the axes as a 1-D constant."""

from __future__ import annotations

import numpy as np

from .emitter import Emitter


def axes_as_1d(node, em: Emitter, shapes, consts, where):
    axes = node.input[1] if len(node.input) > 1 else ""
    if not axes or axes not in consts or np.asarray(consts[axes]).ndim != 0:
        return False
    one = em.const(np.asarray(consts[axes], np.int64).reshape(1), "axes")
    em.op(node.op_type, [node.input[0], one], out=node.output[0])
    return None


REWRITES = {"Unsqueeze": axes_as_1d}  # not Squeeze: onnxruntime refuses rank-0 axes there
