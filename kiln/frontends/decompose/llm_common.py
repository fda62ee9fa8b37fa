"""Helpers the LLM-era op rewrites share (llm_ops.py, bitcast.py)."""

from __future__ import annotations

import sys

import onnx


def elem_type(name: str) -> int | None:
    """The ONNX element type of a tensor of the model decompose() is rewriting (its frame's `model`; the
    rewrite interface passes no types): graph inputs and initializers first, shape inference after."""
    f = sys._getframe(1)
    while f is not None and not isinstance(f.f_locals.get("model"), onnx.ModelProto):
        f = f.f_back
    if f is None:
        return None
    g = f.f_locals["model"].graph
    for t in g.initializer:
        if t.name == name:
            return t.data_type
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.name == name and vi.type.tensor_type.elem_type:
            return vi.type.tensor_type.elem_type
    try:
        inferred = onnx.shape_inference.infer_shapes(f.f_locals["model"], strict_mode=False).graph
    except Exception:
        return None
    return next(
        (
            vi.type.tensor_type.elem_type
            for vi in list(inferred.value_info) + list(inferred.output)
            if vi.name == name and vi.type.tensor_type.elem_type
        ),
        None,
    )
