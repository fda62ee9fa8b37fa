"""Op inputs TVM 0.27's importer needs as compile-time constants (a Tile's repeats, a Range's limits,
a Pad's pads, ...): after folding, each must be a constant. One fed by the data at run time is
refused before TVM sees it, naming the graph inputs it comes from and the --freeze-input that makes
it constant; TVM would otherwise stop with an assertion, or silently compute a wrong shape.
Only inputs that decide a shape (or an axis) are listed: scalars that feed arithmetic (NonMaxSuppression's
limit and thresholds, Clip's bounds, Pad's fill value, Dropout's ratio) compile as ordinary inputs."""

from __future__ import annotations

import onnx

from ..errors import UnsupportedModelError
from .freeze import FLAG

# op type -> indices of the inputs that must be constant (checked against TVM 0.27's converters). Not listed: TopK's
# k, Reshape's, Expand's and ConstantOfShape's shapes, Split's sizes, Tile's repeats, Reduce*'s and Squeeze's axes,
# Resize's roi, scales and sizes, Upsample's scales, Pad's pads, CenterCropPad's shape, AffineGrid's size, Col2Im's
# shapes: run-time tensors of static length (tvm_converters.py, tvm_dynamic_shapes.py, tvm_reduce.py, tvm_resize.py,
# tvm_pad.py, tvm_affine_grid.py, tvm_col2im.py); Range's start, limit and delta: TVM's converter takes run-time scalars
CONSTANT_INPUTS = {
    "Pad": (3,),  # its pads (tvm_pad.py) and constant_value (decompose/runtime_scalars.py) may be run-time inputs
    "OneHot": (1,),
    "CumSum": (1,),
    "CenterCropPad": (2,),
    "MaxUnpool": (2,),
}


# why an op input must be known ahead of time, when it is not "it decides the output's shape"
WHY = {"CumSum": "picks the axis"}
DECIDES_SHAPE = "decides the output's shape"


def check_constant_inputs(model: onnx.ModelProto, where: str) -> None:
    g = model.graph
    consts = {i.name for i in g.initializer}
    inputs = {i.name for i in g.input if i.name not in consts}
    producer = {o: n for n in g.node for o in n.output if o}
    bad = []
    for node in g.node:
        for idx in CONSTANT_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ():
            name = node.input[idx] if idx < len(node.input) else ""
            if name and name not in consts and not _constant_node(producer.get(name)):
                src, via_shape = _sources(name, producer, inputs)
                if (
                    src
                ):  # fed by a graph input (a Shape of a run-time-sized tensor, or constants TVM folds, are left to TVM)
                    bad.append((node, idx, name, sorted(src)))
    if not bad:
        return
    listing = "; ".join(
        f"{n.op_type} node {n.name or n.output[0]!r} input {i} ({name!r}, from graph input(s) {src}) "
        f"{WHY.get(n.op_type, DECIDES_SHAPE)}"
        for n, i, name, src in bad
    )
    feeds = sorted({s for *_, src in bad for s in src})
    fix = (
        f"if these inputs are known when you deploy, freeze them: {FLAG} {feeds[0]}=VALUE (repeatable); "
        "values computed from the data at run time cannot decide these ahead of time (inputs that decide no "
        "shape, such as thresholds or fill values, stay run-time inputs and need no freezing)"
    )
    raise UnsupportedModelError(
        f"{len(bad)} op input(s) must be known at compile time: {listing}",
        ops=[{"op_type": n.op_type, "node": n.name, "input": name, "sources": src} for n, _, name, src in bad],
        where=where,
        fix=fix,
    )


def _constant_node(node) -> bool:
    return node is not None and node.op_type == "Constant"


def reachable(name: str, inputs, step) -> set[str]:
    """The members of `inputs` that `name` is computed from: a walk back from it, step(v) giving the values v is
    computed from (nothing where the walk stops)."""
    seen, stack, out = set(), [name], set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in inputs:
            out.add(v)
        stack.extend(i for i in step(v) if i)
    return out


def _operands(node) -> list[str]:
    """A node's value inputs (CastLike's second input is only a type)."""
    return list(node.input[:1] if node.op_type == "CastLike" else node.input)


def _sources(name: str, producer: dict, inputs: set[str]) -> tuple[set[str], bool]:
    """The graph inputs a value is computed from (not counting those only read through a Shape or
    Size node), and whether a Shape/Size node is on the way."""
    via_shape = []

    def step(v):
        node = None if v in inputs else producer.get(v)
        if node is not None and node.op_type in ("Shape", "Size"):
            via_shape.append(v)
            return ()
        return _operands(node) if node is not None else ()

    return reachable(name, inputs, step), bool(via_shape)


def graph_input_sources(model: onnx.ModelProto, name: str) -> set[str]:
    """The graph inputs `name` is computed from (not counting reads through Shape/Size)."""
    g = model.graph
    consts = {i.name for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output if o}
    return _sources(name, producer, {i.name for i in g.input if i.name not in consts})[0]


# op type -> the inputs whose values decide an output's shape and that Kiln takes at run time (tvm_converters.py and
# the modules it names): each alone compiles with symbolic dims, but a chain of them can leave TVM a rank or a dim it
# cannot track (an expanded AffineGrid's Range -> Unsqueeze -> Transpose on its run-time size)
RUNTIME_SHAPE_INPUTS = {
    **{op: (1,) for op in ("Reshape", "Expand", "Tile", "Split", "Squeeze", "Unsqueeze", "TopK", "AffineGrid")},
    **{op: (1,) for op in ("Upsample", "Trilu", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")},
    **{op: (1,) for op in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "Slice": (1, 2, 3, 4),
    "Resize": (1, 2, 3),
    "Pad": (1,),
    "Col2Im": (1, 2),
}


def runtime_shape_sources(model: onnx.ModelProto, frozen=()) -> dict[str, list[str]]:
    """Graph input -> the ops whose shape-deciding inputs its values reach (not through Shape/Size: those
    read only the pinned shapes; through If/Loop branches too), the frozen inputs left out; empty when
    every shape is static."""
    g = model.graph
    nodes = list(_all_nodes(g))
    producer = {o: n for n in nodes for o in n.output if o}
    inputs = {i.name for i in g.input} - {i.name for i in g.initializer} - set(frozen)
    out: dict[str, list[str]] = {}
    for node in nodes:
        for idx in RUNTIME_SHAPE_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ():
            if idx < len(node.input) and node.input[idx]:
                for src in _value_sources(node.input[idx], producer, inputs):
                    ops = out.setdefault(src, [])
                    if node.op_type not in ops:
                        ops.append(node.op_type)
    return out


def _all_nodes(g: onnx.GraphProto):
    for n in g.node:
        yield n
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                yield from _all_nodes(sub)


def _value_sources(name: str, producer: dict, inputs: set[str]) -> set[str]:
    """The graph inputs whose values `name` is computed from (a node with branches: from everything its
    branches read too), not through Shape/Size nor a CastLike's type input."""

    def step(v):
        node = producer.get(v)
        if node is None or node.op_type in ("Shape", "Size"):
            return ()
        subs = [sub for a in node.attribute for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]
        return _operands(node) + [i for sub in subs for n in _all_nodes(sub) for i in n.input]

    return reachable(name, inputs, step)
