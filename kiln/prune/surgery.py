"""Apply a choice of channels to an ONNX model: shrink it (the channels' weight rows and columns,
biases, BN parameters and per-channel constants deleted; depthwise group counts and the channel
entry of Reshape/Resize shapes updated) or, with zero_only, keep every shape and zero what makes the
channels (weight rows, biases, BN scale and shift, per-channel constants that are added). And the
FLOPs and parameter counts the report compares."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from .graph import ChannelGraph


def apply(graph: ChannelGraph, removed: dict, zero_only: bool = False) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    del model.graph.value_info[:]  # stale shapes: inferred again below
    arrays: dict[str, np.ndarray] = {}
    for e in graph.edits:
        gone = removed.get(e.tensor)
        if gone is None or not len(gone):
            continue
        kept = graph.ties.channels(e.tensor) - len(gone)
        if e.axis == -2:
            if not zero_only:
                node = model.graph.node[e.node]
                for a in node.attribute:
                    if a.name == "group":
                        a.i = kept
            continue
        a = arrays.setdefault(e.init, graph.inits[e.init].copy())
        if e.axis == -1:
            if not zero_only and a[1] > 0:
                a[1] = kept
        elif zero_only:
            if e.zero:
                index = [slice(None)] * a.ndim
                index[e.axis] = gone
                a[tuple(index)] = 0
        else:
            arrays[e.init] = np.delete(a, gone, axis=e.axis)
    for init in model.graph.initializer:
        if init.name in arrays:
            init.CopyFrom(numpy_helper.from_array(arrays[init.name].astype(graph.inits[init.name].dtype), init.name))
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    return model


def _dims(shapes: dict, name: str) -> tuple[int, ...]:
    return tuple(max(d, 1) for d in shapes.get(name, ()))  # a symbolic dimension counts as 1


def flops(graph: ChannelGraph) -> dict[str, int]:
    """Multiply-adds x 2 of every layer and depthwise conv, by node name (output name if unnamed)."""
    out = {}
    for n in graph.model.graph.node:
        if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1 and n.input[1] in graph.inits:
            w = graph.inits[n.input[1]]
            y = _dims(graph.shapes, n.output[0])
            if not y:
                continue
            if n.op_type == "Conv":
                per = math.prod(w.shape[1:])
            else:
                trans_b = any(a.name == "transB" and a.i for a in n.attribute)
                per = w.shape[1] if trans_b else w.shape[0]
            out[n.name or n.output[0]] = 2 * math.prod(y) * per
    return out


def parameters(graph: ChannelGraph) -> int:
    return int(sum(a.size for a in graph.inits.values()))
