"""Hypothesis strategies that damage .tflite flatbuffers and .pt2 archives the ways the world does:
truncation, flipped bytes, 32-bit fields overwritten with huge or negative values (offsets, vector
lengths, tensor indices), zeroed ranges; for a .pt2 also an edited model.json, cut or swapped
weights and dropped members. The seeds are small real models (tests/frontends/tflite_models.py;
a conv net saved with torch.export.save)."""

from __future__ import annotations

import io
import json
import struct
import zipfile

from hypothesis import strategies as st

from .mutators import _mutate_json

INT32 = [0, 1, -1, 2**31 - 1, -(2**31), 2**16, 0x7FFF, 255]
_SEEDS: dict[str, list[bytes]] = {}


def seeds(kind: str) -> list[bytes]:
    """The unbroken models a campaign of this kind starts from (made once per process)."""
    if kind not in _SEEDS:
        _SEEDS[kind] = _tflite_seeds() if kind == "tflite" else _pt2_seeds()
    return _SEEDS[kind]


def _tflite_seeds() -> list[bytes]:
    import numpy as np

    from tests.frontends import tflite_models as tm

    fp = tm.cnn()
    rng = np.random.default_rng(0)
    return [
        fp,
        tm.quantize_full_integer(fp, [rng.standard_normal((1, 16, 16, 3)).astype(np.float32) for _ in range(4)]),
    ]


def _pt2_seeds() -> list[bytes]:
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.bn, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.c(x))).mean((2, 3)))

    buf = io.BytesIO()
    torch.export.save(torch.export.export(Net().eval(), (torch.randn(1, 3, 8, 8),)), buf)
    return [buf.getvalue()]


def _bytes(blob: bytes, draw) -> tuple[bytes, str]:
    out = bytearray(blob)
    if len(out) < 8:
        return blob, "too short to damage further"
    how = draw(st.sampled_from(["truncate", "flip", "int32", "int32", "zero"]))
    if how == "truncate":
        n = draw(st.integers(0, len(out) - 1))
        return bytes(out[:n]), f"truncated to {n}"
    if how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            out[draw(st.integers(0, len(out) - 1))] ^= draw(st.integers(1, 255))
        return bytes(out), "bytes flipped"
    if how == "int32":  # flatbuffer offsets, lengths and indices are 4-byte aligned little-endian ints
        for _ in range(draw(st.integers(1, 4))):
            pos = draw(st.integers(0, len(out) // 4 - 1)) * 4
            out[pos : pos + 4] = struct.pack("<i", draw(st.sampled_from(INT32)))
        return bytes(out), "int32 fields overwritten"
    a = draw(st.integers(0, len(out) - 1))
    n = draw(st.integers(1, 256))
    out[a : a + n] = bytes(len(out[a : a + n]))
    return bytes(out), f"zeroed {n} bytes at {a}"


@st.composite
def broken_tflite(draw) -> tuple[bytes, list[str]]:
    blob = draw(st.sampled_from(seeds("tflite")))
    steps = []
    for _ in range(draw(st.integers(1, 2))):
        blob, what = _bytes(blob, draw)
        steps.append(what)
    return blob, steps


def _members(blob: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return {n: z.read(n) for n in z.namelist()}


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    return buf.getvalue()


@st.composite
def broken_pt2(draw) -> tuple[bytes, list[str]]:
    blob = seeds("pt2")[0]
    data = draw(st.data())
    kind = draw(st.sampled_from(["bytes", "json", "json", "json", "weights", "drop"]))
    if kind == "bytes":
        out, what = _bytes(blob, draw)
        return out, [what]
    members = _members(blob)
    names = sorted(members)
    if kind == "json":
        name = next(n for n in names if n.endswith("models/model.json"))
        doc = json.loads(members[name])
        for _ in range(draw(st.integers(1, 3))):
            doc = _mutate_json(doc, data)
        members[name] = json.dumps(doc).encode() if draw(st.integers(0, 9)) else b"{not json"
        return _zip(members), ["model.json edited"]
    if kind == "weights":
        ws = [n for n in names if "/weights/weight_" in n]
        name = draw(st.sampled_from(ws))
        w = members[name]
        members[name] = w[: draw(st.integers(0, len(w)))] if draw(st.booleans()) else w + w
        return _zip(members), [f"{name} resized"]
    name = draw(st.sampled_from(names))
    del members[name]
    return _zip(members), [f"{name} dropped"]
