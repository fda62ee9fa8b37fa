"""Activations whose TVM 0.27 converter mixes a float32 constant into a float16 graph ("Binary operators
must have the same datatype"): written out with constants cast like the input."""

from __future__ import annotations

import numpy as np
import onnx

from .emitter import Emitter


def elu(node, em: Emitter, shapes, consts, where):
    alpha = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "alpha"), 1.0)
    x = node.input[0]

    def like(v, hint):
        return em.op("CastLike", [em.const(np.float32(v), hint), x])

    neg = em.op("Mul", [like(alpha, "alpha"), em.op("Sub", [em.op("Exp", [x]), like(1.0, "one")])])
    em.op("Where", [em.op("Greater", [x, like(0.0, "zero")]), x, neg], out=node.output[0])


REWRITES = {"Elu": elu}
