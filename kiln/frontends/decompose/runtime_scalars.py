"""Op inputs that decide no shape but that TVM 0.27's converters read only as constants: here they stay
run-time values. Pad's constant_value (TVM's Pad calls .value on it) becomes a Where over a zero pad and
a constant mask of the padded cells; the pads themselves decide the output shape and must be constant.
(NonMaxSuppression's limit and thresholds: tvm_nms.py; Clip's bounds and Dropout's ratio TVM takes as
tensors already.)"""

from __future__ import annotations

import numpy as np

from .emitter import Emitter
from .standard_math import attrs_of


def _mode(node) -> str:
    m = attrs_of(node).get("mode", b"constant")
    return m.decode() if isinstance(m, bytes) else m


def _mask(shape, pads, axes) -> np.ndarray | None:
    """True on the cells of the padded tensor that hold x; None for a negative pad (a crop)."""
    rank = len(shape)
    axes = [a % rank for a in (range(rank) if axes is None else axes)]
    if any(p < 0 for p in pads):
        return None
    widths = [(0, 0)] * rank
    for k, a in enumerate(axes):
        widths[a] = (int(pads[k]), int(pads[k + len(axes)]))
    return np.pad(np.ones(shape, bool), widths)


def pad_runtime_value(node, em: Emitter, shapes, consts, where):
    """Pad whose constant_value is a run-time input: Where(mask, Pad(x, pads, 0), value). In the other modes
    the value is unused and dropped."""
    ins = list(node.input) + [""] * (4 - len(node.input))
    x, pads, value, axes = ins[:4]
    if not value or value in consts or pads not in consts or (axes and axes not in consts):
        return False
    if _mode(node) != "constant":
        em.op("Pad", [x, pads, "", axes] if axes else [x, pads], out=node.output[0], mode=_mode(node))
        return True
    shape = shapes.get(x)
    ax = None if not axes else [int(a) for a in np.asarray(consts[axes]).reshape(-1)]
    mask = None if shape is None else _mask(shape, np.asarray(consts[pads]).reshape(-1), ax)
    if mask is None:
        return False
    padded = em.op("Pad", [x, pads, "", axes] if axes else [x, pads])
    em.op("Where", [em.const(mask, "inside"), padded, value], out=node.output[0])
    return True


REWRITES = {"Pad": pad_runtime_value}
