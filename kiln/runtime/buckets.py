"""Shape buckets at run time: pick the smallest bucket that holds the inputs, pad them to it
(policy `pad`) or refuse anything but an exact bucket (policy `error`), and crop the outputs back.

Cropping rule (documented in the README): where an input was padded on axis i from n to N, every
output axis i of size N is cropped back to n. That is exact for batch padding (axis 0), and for
outputs that keep an input's spatial size (segmentation maps); outputs of fixed size (logits) are
returned as computed on the zero-padded input."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import InputError
from .artifact import TensorSpec


@dataclasses.dataclass(frozen=True)
class Bucket:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    pad_values: tuple[tuple[str, float], ...] = ()  # what each input is padded with (--pad-value; else 0)

    def holds(self, shapes: dict[str, tuple[int, ...]]) -> bool:
        return all(
            len(shapes[s.name]) == len(s.shape) and all(a <= b for a, b in zip(shapes[s.name], s.shape))
            for s in self.inputs
        )

    def exact(self, shapes: dict[str, tuple[int, ...]]) -> bool:
        return all(tuple(shapes[s.name]) == s.shape for s in self.inputs)

    @property
    def numel(self) -> int:
        return sum(int(np.prod(s.shape, dtype=np.int64)) for s in self.inputs)


def describe(buckets) -> str:
    return ", ".join(b.name for b in buckets)


def choose(
    buckets: list[Bucket], shapes: dict[str, tuple[int, ...]], policy: str, where: str, pinned=frozenset()
) -> int:
    """Index of the bucket to run: an exact one, else (policy pad) the smallest that holds it.
    pinned: the inputs whose shape the compile chose (--input-shape, --shape-buckets): only their
    dims were symbolic in the model, so only for them does recompiling for another shape help."""
    for i, b in enumerate(buckets):
        if b.exact(shapes):
            return i
    given = ", ".join(f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items())
    if len(buckets) == 1:
        s = [s for s in buckets[0].inputs if tuple(shapes[s.name]) != s.shape][0]
        raise InputError(
            f"input {s.name!r} has shape {'x'.join(map(str, shapes[s.name]))}, the model was compiled for "
            f"{'x'.join(map(str, s.shape))}",
            where=where,
            fix=f"reshape or resize it, or recompile with --input-shape {s.name}:{'x'.join(map(str, shapes[s.name]))} "
            f"(or --shape-buckets for several sizes)"
            if s.name in pinned
            else f"reshape or resize it to {'x'.join(map(str, s.shape))}: the model declares this shape static",
        )
    fits = [i for i, b in enumerate(buckets) if b.holds(shapes)]
    if policy == "error" or not fits:
        why = "is not one of the buckets (bucket policy 'error')" if fits else "is larger than every bucket"
        raise InputError(
            f"input {given} {why}; the buckets are {describe(buckets)}",
            where=where,
            fix="send a bucket's exact shape"
            + (", or load with bucket_policy='pad'" if fits else "")
            + ", or recompile with a --shape-buckets list that covers it",
        )
    return min(fits, key=lambda i: buckets[i].numel)


def pad(arrays: list[np.ndarray], bucket: Bucket) -> tuple[list[np.ndarray], dict[int, tuple[int, int]]]:
    """Pad each input at the end of every axis to the bucket's shape, with its pad value (zeros unless the
    compile gave --pad-value: token ids take the tokenizer's pad id, an attention mask zeros, so the padded
    positions are masked out). Returns the arrays and {axis: (bucket size, original size)} of the padded axes."""
    if all(a.shape == spec.shape for a, spec in zip(arrays, bucket.inputs)):
        return arrays, {}  # the common case, an exact bucket: nothing to build (a model's run is a few us)
    values = dict(bucket.pad_values)
    out, padded = [], {}
    for a, spec in zip(arrays, bucket.inputs):
        if a.shape == spec.shape:
            out.append(a)
            continue
        for ax, (n, big) in enumerate(zip(a.shape, spec.shape)):
            if n != big:
                padded[ax] = (big, n)
        widths = [(0, big - n) for n, big in zip(a.shape, spec.shape)]
        out.append(np.pad(a, widths, constant_values=np.asarray(values.get(spec.name, 0)).astype(a.dtype)))
    return out, padded


def crop(outputs: list[np.ndarray], padded: dict[int, tuple[int, int]]) -> list[np.ndarray]:
    if not padded:
        return outputs
    res = []
    for o in outputs:
        idx = tuple(
            slice(0, padded[ax][1]) if ax in padded and o.shape[ax] == padded[ax][0] else slice(None)
            for ax in range(o.ndim)
        )
        res.append(np.ascontiguousarray(o[idx]))
    return res
