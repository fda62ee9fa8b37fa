"""Shape values as tensors where TVM's importer needs them. TVM 0.27 imports `Shape` of a tensor whose
size is known only at run time (after NonZero, NMS) as a shape expression, and only a few converters
take one ("Node X cannot handle ShapeExpr inputs" elsewhere: detection post-processing computes
min(candidates, k) with ReduceMin, Mul, Sub on such shapes). Each value that may be a shape
expression and feeds any other op gets a Cast to int64 first, which TVM turns into a tensor."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

INT32_MAX = np.iinfo(np.int32).max

# the converters of TVM 0.27 that accept shape expressions (onnx_frontend._construct_nodes)
SHAPE_COMPATIBLE = frozenset(
    {
        "Reshape",
        "Resize",
        "ConstantOfShape",
        "Gather",
        "Slice",
        "Shape",
        "Expand",
        "Concat",
        "Equal",
        "Where",
        "Cast",
        "CastLike",
        "Squeeze",
    }
)
# ops whose output stays a shape expression when an input is one
SHAPE_PRESERVING = frozenset({"Shape", "Gather", "Slice", "Concat", "Squeeze", "Unsqueeze", "Where", "Identity"})


def cast_shape_values(model: onnx.ModelProto) -> int:
    """Insert the Casts (in place); returns how many."""
    g = model.graph
    shape_valued: set[str] = set()
    out, added, casts = [], 0, set()
    for node in g.node:
        if node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        if node.op_type not in SHAPE_COMPATIBLE and node.op_type != "Unsqueeze":
            for i, name in enumerate(node.input):
                if name in shape_valued:
                    cast = f"{name}/as_tensor"
                    if cast not in casts:
                        casts.add(cast)
                        out.append(
                            onnx.helper.make_node(
                                "Cast", [name], [cast], to=onnx.TensorProto.INT64, name=f"{name}/as_tensor"
                            )
                        )
                        added += 1
                    node.input[i] = cast
        if node.op_type == "Shape" or (node.op_type in SHAPE_PRESERVING and any(i in shape_valued for i in node.input)):
            shape_valued.update(o for o in node.output if o)
        out.append(node)
    if added:
        del g.node[:]
        g.node.extend(out)
    return added


def clamp_slice_bounds(model: onnx.ModelProto) -> int:
    """Slice starts/ends beyond int32 (exporters write INT64_MAX for "to the end") clamped to +-INT32_MAX,
    in place: the same slice (no tensor has 2^31 elements on an axis), but TVM's legalization of a slice
    of a run-time-sized tensor builds int32 index arithmetic and rejects the int64 literal. Returns how many."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    clamped: dict[str, str] = {}
    for n in g.node:
        if n.op_type != "Slice" or n.domain not in ("", "ai.onnx"):
            continue
        for k in (1, 2):
            name = n.input[k] if k < len(n.input) else ""
            if name not in inits:
                continue
            if name not in clamped:
                a = numpy_helper.to_array(inits[name])
                if a.dtype != np.int64 or np.abs(a).max(initial=0) <= INT32_MAX:
                    clamped[name] = name
                    continue
                clamped[name] = f"{name}/int32"
                g.initializer.append(
                    numpy_helper.from_array(np.clip(a, -INT32_MAX, INT32_MAX).astype(np.int64), clamped[name])
                )
            n.input[k] = clamped[name]
    return sum(1 for k, v in clamped.items() if k != v)
