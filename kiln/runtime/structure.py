"""Sequence and optional inputs and outputs at run time: the manifest's `io_structure` (written by the
compiler, frontends/sequence_io.py) says which of the model's inputs and outputs are sequences (a Python
list of arrays, of the length compiled for) or optionals (None when absent), and which flat tensors of the
compiled function hold their elements. Standard library + numpy only (the runtime imports no compiler)."""

from __future__ import annotations

import numpy as np

from ..errors import InputError


class Structure:
    def __init__(self, entry: dict, where: str):
        self.inputs: dict = dict(entry.get("inputs") or {})
        self.outputs: list = [tuple(o) for o in entry.get("outputs") or []]
        self.where = where

    def flatten(self, feed: dict) -> dict:
        """The feed with each sequence/optional input replaced by its flat tensors."""
        if not isinstance(feed, dict):
            return feed  # Model.validate says what is wrong
        flat = {k: v for k, v in feed.items() if k not in self.inputs}
        for name, node in self.inputs.items():
            if name in feed:
                self._flat(name, node, feed[name], flat)
        return flat

    def _flat(self, name: str, node, value, out: dict) -> None:
        if isinstance(node, str):
            out[node] = value
        elif "sequence" in node:
            items = node["sequence"]
            if not isinstance(value, (list, tuple)):
                raise InputError(
                    f"input {name!r} is a sequence: pass a list of {len(items)} arrays, got {type(value).__name__}",
                    where=self.where,
                    fix=f"e.g. run({{{name!r}: [a, b, ...]}})",
                )
            if len(value) != len(items):
                raise InputError(
                    f"input {name!r} is a sequence compiled for {len(items)} element(s), got {len(value)}",
                    where=self.where,
                    fix=f"feed {len(items)} arrays, or recompile with --input-shape {name}:[...] for this length",
                )
            for sub, v in zip(items, value):
                self._flat(name, sub, v, out)
        elif node.get("present") is False:
            if value is not None:
                raise InputError(
                    f"input {name!r} is an optional compiled as absent: pass None",
                    where=self.where,
                    fix=f"recompile with --input-shape {name}:SHAPE to feed a value",
                )
        else:
            if value is None:
                raise InputError(
                    f"input {name!r} is an optional compiled as present: pass its value, not None",
                    where=self.where,
                    fix=f"recompile with --input-shape {name}:none to leave it out",
                )
            self._flat(name, node["optional"], value, out)

    def unflatten(self, results: dict) -> dict:
        """The outputs as the model declares them: lists for sequences, None for absent optionals."""
        return {name: _value(node, results) for name, node in self.outputs}


def _value(node, results: dict):
    if isinstance(node, str):
        return results[node]
    if "sequence" in node:
        return [_value(n, results) for n in node["sequence"]]
    present = node.get("present")
    if isinstance(present, str):
        present = bool(np.asarray(results[present]).reshape(-1)[0])
    return _value(node["optional"], results) if present else None
