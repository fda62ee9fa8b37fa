"""`--freeze-input NAME=VALUE`: an input the deployer knows in advance (a sample rate, a flag, the
axes of an op) becomes a constant of the graph, so the `If`s and shape arithmetic that read it fold
away at compile time. Parsed once here into FrozenInput; written into the graph before pinning."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import OptionsError, ShapeError

FLAG = "--freeze-input"
MAX_ELEMENTS = 4096  # scalars and small arrays: a frozen input is a value, not a weight


@dataclasses.dataclass(frozen=True)
class FrozenInput:
    name: str
    shape: tuple[int, ...]
    values: tuple  # flattened; cast to the input's declared element type when frozen

    @staticmethod
    def parse(spec: str) -> FrozenInput:
        name, sep, text = str(spec).partition("=")
        if not sep or not name.strip() or not text.strip():
            raise OptionsError(
                f"bad frozen input {spec!r}",
                where=FLAG,
                fix=f"write it as NAME=VALUE, e.g. {FLAG} sr=16000 or {FLAG} axes=[0,2]",
            )
        text = text.strip()
        try:
            value = json.loads(text if text.startswith("[") or "," not in text else f"[{text}]")
        except ValueError:
            raise OptionsError(
                f"bad value {text!r} for input {name!r}",
                where=FLAG,
                fix="give a number, true/false, or a list: 16000, 0.5, [1,2,3], [[1,0],[0,1]]",
            ) from None
        return FrozenInput.of(name.strip(), value)

    @staticmethod
    def of(name: str, value) -> FrozenInput:
        try:
            a = np.asarray(value)
        except ValueError:
            a = np.asarray([], dtype=object)
        if a.dtype.kind not in "biuf":
            raise OptionsError(
                f"the value for input {name!r} is not a number or a rectangular list of numbers",
                where=FLAG,
                fix=f"e.g. {FLAG} {name}=16000 or {FLAG} {name}=[0,2]",
            )
        if a.size > MAX_ELEMENTS:
            raise OptionsError(
                f"the value for input {name!r} has {a.size} elements (at most {MAX_ELEMENTS})",
                where=FLAG,
                fix="freeze scalars and small arrays; a large constant belongs in the model as a weight",
            )
        return FrozenInput(name, tuple(int(d) for d in a.shape), tuple(a.reshape(-1).tolist()))

    def array(self, dtype=None) -> np.ndarray:
        return np.asarray(self.values, dtype=dtype).reshape(self.shape)

    def to_json(self):
        return self.array().tolist()


def parse_frozen_inputs(specs) -> tuple[FrozenInput, ...]:
    """Accepts ["sr=16000", ...], {"sr": 16000} or FrozenInput objects; one per input name."""
    if not specs:
        return ()
    items = (
        [FrozenInput.of(k, v) for k, v in specs.items()]
        if isinstance(specs, dict)
        else [
            s if isinstance(s, FrozenInput) else FrozenInput.parse(s)
            for s in ([specs] if isinstance(specs, str) else specs)
        ]
    )
    seen = set()
    for f in items:
        if f.name in seen:
            raise OptionsError(f"input {f.name!r} is frozen twice", where=FLAG, fix=f"pass {FLAG} once per input")
        seen.add(f.name)
    return tuple(sorted(items, key=lambda f: f.name))


def freeze_inputs(model: onnx.ModelProto, frozen: tuple[FrozenInput, ...], where: str) -> None:
    """Turn each frozen input into an initializer (in place), cast to its declared element type and
    checked against its declared shape."""
    if not frozen:
        return
    from .shapes import declared_dims, graph_inputs

    inputs = {vi.name: vi for vi in graph_inputs(model)}
    unknown = [f.name for f in frozen if f.name not in inputs]
    if unknown:
        raise OptionsError(
            f"{FLAG} names unknown input(s) {unknown}", where=where, fix=f"the model's inputs are {list(inputs)}"
        )
    for f in frozen:
        vi = inputs[f.name]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        raw = f.array()
        value = raw.astype(dtype)
        if not np.array_equal(value.astype(raw.dtype), raw):
            raise OptionsError(
                f"value {f.to_json()} for input {f.name!r} does not fit its type {dtype}",
                where=FLAG,
                fix=f"give a value of type {dtype}",
            )
        decl = declared_dims(vi)
        if (
            decl is not None
            and all(isinstance(d, int) and d > 0 for d in decl)
            and value.size == int(np.prod(decl, dtype=np.int64))
        ):
            value = value.reshape(decl)  # sr=16000 for an input declared [1]
        if decl is not None and (
            len(decl) != value.ndim or any(isinstance(d, int) and d > 0 and d != s for d, s in zip(decl, value.shape))
        ):
            raise ShapeError(
                f"value for input {f.name!r} has shape {list(value.shape)}, the model declares {decl}",
                where=FLAG,
                fix=f"give a value of shape {decl}",
            )
        model.graph.initializer.append(numpy_helper.from_array(value, f.name))
    names = {f.name for f in frozen}
    keep = [vi for vi in model.graph.input if vi.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(keep)
