"""Sequence- and optional-typed graph inputs and outputs, flattened into tensors. A compiled function
takes and returns tensors of static shapes, so a sequence input is compiled for a pinned number of
elements and their shapes (`--input-shape x:[10,10,10]`, or `input_shapes={"x": [(10,), (10,), (10,)]}`),
an optional input for being present (its value's shape) or absent (`x:none`, or None). Each element
becomes a tensor input of its own (`x[0]`, `x[1]`, ...; an optional tensor's value `x.value`), and the
model's I/O structure is recorded (the ONNX model's metadata, then the artifact's manifest:
`io_structure`) so that the runtime (kiln/runtime/structure.py) takes and returns Python lists and None.

A structure node is a flat tensor's name (str), {"sequence": [node, ...]}, or {"optional": node or None,
"present": true, false, or the name of a flat bool output saying it at run time}."""

from __future__ import annotations

import dataclasses
import json

import onnx

from ..errors import ShapeError

META_KEY = "kiln.io_structure"
ABSENT = "none"


@dataclasses.dataclass(frozen=True)
class Seq:
    """A sequence of static length: its elements' tensor names."""

    items: tuple

    def __init__(self, items):
        object.__setattr__(self, "items", tuple(items))


@dataclasses.dataclass(frozen=True)
class Opt:
    """An optional: present (True/False, or the name of a bool tensor known at run time), its value (a Seq, a
    tensor name, or None when absent) and, for an empty one, the value's type (onnx TypeProto)."""

    present: object
    value: object
    type: object = None


class SeqShape(tuple):
    """A pinned sequence: the shapes of its elements, in order (a tuple of dim tuples)."""


def parse_dims(value):
    """One input's pinned shape as given in a dict: a tensor's dims, a sequence's element shapes (a list of
    shapes: SeqShape), None (an absent optional) or a string as --input-shape takes it."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_spec(value, "?")
    items = list(value)
    if items and all(isinstance(v, (list, tuple)) for v in items):
        return SeqShape(tuple(int(d) for d in v) for v in items)
    return SeqShape() if isinstance(value, SeqShape) else tuple(int(d) for d in items)


def parse_spec(dims: str, spec: str):
    """The dims part of NAME:DIMS for a sequence (`[10,3x4]`, `[]`, `[()]` for one scalar) or an absent
    optional (`none`); None when it is neither (a tensor's dims)."""
    text = dims.strip().lower()
    if text == ABSENT:
        return None
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(spec)
    inner = text[1:-1].strip()
    out = []
    for part in inner.split(",") if inner else []:
        part = part.strip()
        if part in ("()", ""):
            out.append(())
            continue
        try:
            out.append(tuple(int(d) for d in part.split("x")))
        except ValueError:
            raise ShapeError(
                f"bad sequence element shape {part!r} in {spec!r}",
                where="--input-shape",
                fix="write a sequence as NAME:[SHAPE,SHAPE,...], e.g. --input-shape x:[3x4,3x4] ([] when empty, "
                "() for a scalar element)",
            ) from None
    return SeqShape(out)


def is_structured(vi: onnx.ValueInfoProto) -> bool:
    return vi.type.WhichOneof("value") in ("sequence_type", "optional_type")


def _elem_type(tp: onnx.TypeProto, name: str, where: str) -> int:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return tp.tensor_type.elem_type
    if kind in ("sequence_type", "optional_type"):
        return _elem_type(getattr(tp, kind).elem_type, name, where)
    raise ShapeError(
        f"input {name!r} is a {kind or 'value of no type'}: only tensors, sequences of tensors and optionals of those "
        "can be compiled",
        where=where,
        fix="feed tensors (a map or a sequence of sequences has no static representation)",
    )


def expand_inputs(model: onnx.ModelProto, shapes: dict, where: str) -> tuple[dict, dict]:
    """Replace the sequence and optional inputs of the graph by tensor inputs, one per element, using their
    pinned shapes (taken out of `shapes`, in place). Returns (the structure of each expanded input, the
    values the flattening pass starts from: name -> sequences.Seq/Opt)."""
    structure, seeds, kept = {}, {}, []
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits or not is_structured(vi):
            kept.append(vi)
            continue
        if vi.name not in shapes:
            raise ShapeError(
                f"input {vi.name!r} is a {vi.type.WhichOneof('value').split('_')[0]}: its length and element shapes "
                "must be pinned (a compiled model has static shapes)",
                where=where,
                fix=f"pin it, e.g. --input-shape {vi.name}:[2x3,2x3] (a sequence of two 2x3 tensors; [] when empty; "
                f"{vi.name}:{ABSENT} for an absent optional)",
            )
        pinned = shapes.pop(vi.name)
        elem = _elem_type(vi.type, vi.name, where)
        tp = vi.type
        if tp.WhichOneof("value") == "optional_type":
            if pinned is None:
                structure[vi.name] = {"optional": None, "present": False}
                seeds[vi.name] = Opt(False, None, tp.optional_type.elem_type)
                continue
            tp = tp.optional_type.elem_type
        elif pinned is None:
            raise ShapeError(
                f"input {vi.name!r} is a sequence, not an optional: it cannot be pinned absent",
                where=where,
                fix=f"pin its elements, e.g. --input-shape {vi.name}:[2x3] ([] when empty)",
            )
        node, value = _flat_inputs(vi.name, tp, pinned, elem, kept, where)
        if vi.type.WhichOneof("value") == "optional_type":
            node, value = {"optional": node, "present": True}, Opt(True, value, None)
        structure[vi.name], seeds[vi.name] = node, value
    if structure:
        del model.graph.input[:]
        model.graph.input.extend(kept)
    return structure, seeds


def _flat_inputs(name: str, tp: onnx.TypeProto, pinned, elem: int, out: list, where: str):
    if tp.WhichOneof("value") == "sequence_type":
        if pinned == ():  # [] in a dict: no elements
            pinned = SeqShape()
        if not isinstance(pinned, SeqShape):
            raise ShapeError(
                f"input {name!r} is a sequence: pin its element shapes, not one tensor shape",
                where=where,
                fix=f"e.g. --input-shape {name}:[{'x'.join(map(str, pinned)) or '()'}] for one element of that shape",
            )
        names = [f"{name}[{i}]" for i in range(len(pinned))]
        out.extend(onnx.helper.make_tensor_value_info(n, elem, list(s)) for n, s in zip(names, pinned))
        return {"sequence": names}, Seq(names)
    if isinstance(pinned, SeqShape):
        raise ShapeError(
            f"input {name!r} is an optional tensor: pin one shape, not a sequence",
            where=where,
            fix=f"e.g. --input-shape {name}:2x3",
        )
    flat = f"{name}.value"
    out.append(onnx.helper.make_tensor_value_info(flat, elem, list(pinned)))
    return flat, flat


def write_structure(model: onnx.ModelProto, inputs: dict, outputs: list) -> None:
    """Record the I/O structure in the model's metadata (nothing when every input and output is a tensor)."""
    if not inputs and all(isinstance(node, str) and node == name for name, node in outputs):
        return
    entry = next((p for p in model.metadata_props if p.key == META_KEY), None) or model.metadata_props.add()
    entry.key = META_KEY
    entry.value = json.dumps({"inputs": inputs, "outputs": [[n, node] for n, node in outputs]})


def read_structure(model) -> dict | None:
    """The I/O structure recorded by write_structure; None for a model of tensors only."""
    props = getattr(model, "metadata_props", None) or ()
    entry = next((p for p in props if p.key == META_KEY), None)
    return json.loads(entry.value) if entry is not None else None
