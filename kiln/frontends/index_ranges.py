"""The values an integer graph input may take where it indexes a table: an input that reaches a Gather's indices
through ops that keep its values (Cast to int32 or int64, Reshape, Unsqueeze, Squeeze, Flatten, Identity)
must lie in [-rows, rows - 1] of the gathered axis (ONNX Gather; onnxruntime rejects anything else). The runtime
checks such inputs before a run (kiln.runtime.model): a token id past the vocabulary is an input error naming the
input and its range, not a read outside the embedding table (the Gather itself clamps:
compiler/passes/clip_take_indices.py).

    index_ranges(model) -> {input name: [lowest, highest, gather node name]}"""

from __future__ import annotations

import onnx
from onnx import TensorProto

KEEP_VALUES = {"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast"}
WIDE = {TensorProto.INT32, TensorProto.INT64}  # a Cast to these keeps every index a table can have
INTEGERS = {
    TensorProto.INT8,
    TensorProto.INT16,
    TensorProto.INT32,
    TensorProto.INT64,
    TensorProto.UINT8,
    TensorProto.UINT16,
    TensorProto.UINT32,
    TensorProto.UINT64,
}


def index_ranges(model: onnx.ModelProto) -> dict[str, list]:
    """Only gathers from a constant table count: a run-time tensor's rows can differ between shape buckets."""
    g = model.graph
    dims = {t.name: list(t.dims) for t in g.initializer}
    inputs = {i.name: i.type.tensor_type.elem_type for i in g.input if i.name not in dims}
    producer = {o: n for n in g.node for o in n.output}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            dims[n.output[0]] = list(n.attribute[0].t.dims)
    ranges: dict[str, list] = {}
    for node in g.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        source = _source_input(node.input[1], producer, inputs)
        shape = dims.get(node.input[0])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if source is None or not shape or not -len(shape) <= axis < len(shape):
            continue
        rows = shape[axis]
        if not isinstance(rows, int) or rows <= 0:
            continue
        lo, hi = -rows, rows - 1
        if source in ranges:  # several tables: the values every one of them takes
            lo, hi = max(lo, ranges[source][0]), min(hi, ranges[source][1])
        ranges[source] = [lo, hi, node.name or node.output[0]]
    return ranges


def _source_input(name: str, producer: dict, inputs: dict) -> str | None:
    """The integer graph input `name` is (through value-keeping ops), or None."""
    while name not in inputs:
        node = producer.get(name)
        if node is None or node.op_type not in KEEP_VALUES or not node.input:
            return None
        if node.op_type == "Cast" and next((a.i for a in node.attribute if a.name == "to"), None) not in WIDE:
            return None
        name = node.input[0]
    return name if inputs[name] in INTEGERS else None
