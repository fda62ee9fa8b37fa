"""Sequence ops with a static number of elements, as tensors. TVM 0.27 converts a sequence into a
Relax tuple (SequenceConstruct/At/Insert/Erase/Length, ConcatFromSequence), which is static as
long as its length is; its SplitToSequence, though, needs a constant split and splits a scalar
chunk size into equal sections (ONNX makes the last chunk shorter), so Kiln writes SplitToSequence
as Split (+ Squeeze for keepdims=0) into SequenceConstruct. A split computed from data gives a
data-dependent number of elements: refused by name."""

from __future__ import annotations

import numpy as np
import onnx

from ...errors import UnsupportedModelError
from .emitter import Emitter


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def split_to_sequence(node, em: Emitter, shapes, consts, where, runtime_split=None) -> None:
    """runtime_split: raises the error for a split fed at run time that is not a list of static length (the
    number of elements would be data-dependent); without it such a split is refused here."""
    where_n = f"{where}: node {node.name!r}"
    x = node.input[0]
    split = node.input[1] if len(node.input) > 1 and node.input[1] else ""
    opset = getattr(em, "opset", 13)
    if split and split not in consts and runtime_split is not None:
        if len(shapes.get(split, ())) != 1 or opset < 13:
            runtime_split()
        # sizes fed at run time, as many as the split has: Split's run-time sizes (tvm_dynamic_shapes.py)
        parts = [em.name("part") for _ in range(shapes[split][0])]
        axis = _attr(node, "axis", 0)
        em.nodes.append(onnx.helper.make_node("Split", [x, split], parts, name=em.name("Split"), axis=axis))
        em.op("SequenceConstruct", parts, out=node.output[0])
        return
    if split and split not in consts:
        raise UnsupportedModelError(
            f"SplitToSequence with a split {split!r} computed from data has a run-time number of elements",
            where=where_n,
            fix="make the split sizes a constant (an initializer), or freeze the input with "
            "--freeze-input NAME=VALUE if it is known",
        )
    if x not in shapes:
        raise UnsupportedModelError(
            f"SplitToSequence input {x!r} has no static shape", where=where_n, fix="pin every input with --input-shape"
        )
    rank = len(shapes[x])
    axis = _attr(node, "axis", 0) % rank
    dim = shapes[x][axis]
    s = np.asarray(consts[split]).astype(np.int64) if split else np.array(1, np.int64)
    if s.ndim == 0:  # a chunk size: equal chunks, the last one shorter
        chunk = int(s)
        sizes = [min(chunk, dim - k) for k in range(0, dim, chunk)]
    else:
        sizes = [int(v) for v in s]
    squeeze = not split and not _attr(node, "keepdims", 1)
    if len(sizes) == 1:
        parts = [em.op("Identity", [x])]
    elif opset >= 13:
        parts = [em.name("part") for _ in sizes]
        em.nodes.append(
            onnx.helper.make_node(
                "Split", [x, em.const(np.array(sizes, np.int64), "split")], parts, name=em.name("Split"), axis=axis
            )
        )
    else:
        parts = [em.name("part") for _ in sizes]
        em.nodes.append(onnx.helper.make_node("Split", [x], parts, name=em.name("Split"), axis=axis, split=sizes))
    if squeeze:
        if opset >= 13:
            parts = [em.op("Squeeze", [p, em.const(np.array([axis], np.int64), "ax")]) for p in parts]
        else:
            parts = [em.op("Squeeze", [p], axes=[axis]) for p in parts]
    em.op("SequenceConstruct", parts, out=node.output[0])


REWRITES = {"SplitToSequence": split_to_sequence}
