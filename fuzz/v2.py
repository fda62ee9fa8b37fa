"""Damaged Open Inference Protocol (KServe V2) infer bodies, JSON and binary, for the server's V2 codec:
every case must decode or raise an InputError, never another exception. A case is a payload of a 4-byte
Inference-Header-Content-Length (0xFFFFFFFF: no header) and the body."""

from __future__ import annotations

import json
import struct

import numpy as np
from hypothesis import strategies as st

from kiln.runtime.artifact import TensorSpec

NO_HEADER = 0xFFFFFFFF
INPUTS = (TensorSpec("x", (2, 3), "float32"), TensorSpec("ids", (2,), "int64"))
OUTPUTS = (TensorSpec("y", (2, 3), "float32"),)
ODD = [None, True, -1, 0, 2**31, 2**63, 1.5, "3", [], {}, [[1]], "FP32", "BYTES", [-1, 3], [2**40] * 4]
KEYS = ["name", "shape", "datatype", "data", "parameters", "binary_data_size"]


def seed(binary: bool) -> tuple[dict, bytes]:
    x, ids = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([4, 5], np.int64)
    doc = {"id": "r", "inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": binary}}]}
    raw = b""
    for name, a, dt in (("x", x, "FP32"), ("ids", ids, "INT64")):
        t = {"name": name, "shape": list(a.shape), "datatype": dt}
        if binary:
            t["parameters"] = {"binary_data_size": a.nbytes}
            raw += a.tobytes()
        else:
            t["data"] = a.tolist()
        doc["inputs"].append(t)
    return doc, raw


def _mutate_doc(doc: dict, data) -> str:
    target = data.draw(st.sampled_from(["input", "request", "output"]))
    if target == "request":
        key = data.draw(st.sampled_from(["inputs", "outputs", "parameters", "id"]))
        doc[key] = data.draw(st.sampled_from(ODD))
        return f"request.{key}"
    items = doc.get("inputs" if target == "input" else "outputs")
    if not isinstance(items, list) or not items or not isinstance(items[0], dict):  # an earlier mutation took it
        return "noop"
    t = items[data.draw(st.integers(0, len(items) - 1))]
    if not isinstance(t, dict):
        return "noop"
    key = data.draw(st.sampled_from(KEYS))
    value = data.draw(st.sampled_from(ODD + ["drop"]))
    if key == "binary_data_size" and isinstance(t.get("parameters", {}), dict):
        t.setdefault("parameters", {})[key] = value
    elif value == "drop":
        t.pop(key, None)
    else:
        t[key] = value
    return f"{target}.{key}={value!r}"[:60]


def _mutate_bytes(body: bytes, header: int, data) -> tuple[bytes, int, str]:
    how = data.draw(st.sampled_from(["truncate", "extend", "header+", "header-", "no header", "flip"]))
    if how == "truncate":
        return body[: data.draw(st.integers(0, max(0, len(body) - 1)))], header, how
    if how == "extend":
        return body + b"\0" * data.draw(st.integers(1, 64)), header, how
    if how in ("header+", "header-"):
        return body, max(0, header + data.draw(st.integers(1, 64)) * (1 if how == "header+" else -1)), how
    if how == "no header":
        return body, NO_HEADER, how
    i = data.draw(st.integers(0, max(0, len(body) - 1)))
    return body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1 :] if body else body, header, how


@st.composite
def broken_v2(draw) -> tuple[bytes, list[str]]:
    binary = draw(st.booleans())
    doc, raw = seed(binary)
    what = ["binary" if binary else "json"]
    for _ in range(draw(st.integers(0, 3))):
        what.append(_mutate_doc(doc, _Drawer(draw)))
    header = json.dumps(doc).encode()
    body, length = header + raw, len(header) if binary else NO_HEADER
    if draw(st.booleans()):
        body, length, how = _mutate_bytes(body, length if length != NO_HEADER else len(header), _Drawer(draw))
        what.append(how)
    return struct.pack("<I", length) + body, what


class _Drawer:
    """The `data.draw` interface over a composite's draw."""

    def __init__(self, draw):
        self.draw = draw
