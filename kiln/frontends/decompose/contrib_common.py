"""Helpers the onnxruntime contrib-op rewrites share (contrib.py, contrib_attention.py)."""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedModelError
from .emitter import Emitter

F32 = np.float32


def fail(node, where, msg, fix):
    raise UnsupportedModelError(f"{node.op_type}: {msg}", where=f"{where}: node {node.name!r}", fix=fix)


def ones_like(em: Emitter, x: str) -> str:
    return em.op("Add", [em.op("Mul", [x, em.const(F32(0))]), em.const(F32(1))])


def cumsum(em: Emitter, x: str, axis: int) -> str:
    return em.op("CumSum", [x, em.const(np.int64(axis), "axis")])
