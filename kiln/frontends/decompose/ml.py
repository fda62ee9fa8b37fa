"""The ai.onnx.ml ops that are tensor arithmetic (scikit-learn converters write them around a model):
Binarizer (x > threshold), ArrayFeatureExtractor (a Gather on the last axis); the tree ensembles as
gathers over static node arrays (ml_trees.py). String label encoders stay unsupported, named by the
preflight (TVM has no string tensors)."""

from __future__ import annotations

import numpy as np
import onnx

from .emitter import Emitter
from .ml_trees import REWRITES as TREE_REWRITES


def binarizer(node, em: Emitter, shapes, consts, where):
    t = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "threshold"), 0.0)
    x = node.input[0]
    above = em.op("Greater", [x, em.op("CastLike", [em.const(np.float32(t), "threshold"), x])])
    em.op("CastLike", [above, x], out=node.output[0])


def array_feature_extractor(node, em: Emitter, shapes, consts, where):
    em.op("Gather", [node.input[0], node.input[1]], out=node.output[0], axis=-1)


ML_REWRITES = {
    "ai.onnx.ml": {"Binarizer": binarizer, "ArrayFeatureExtractor": array_feature_extractor, **TREE_REWRITES}
}
