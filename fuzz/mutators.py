"""Hypothesis strategies that damage real models and artifacts the ways the world does."""

from __future__ import annotations

import copy
import io
import json
import zipfile

import numpy as np
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from .seeds import SEEDS

HUGE = [0, -1, 2**31, 2**40, 2**62]
ELEM_TYPES = [TensorProto.STRING, TensorProto.COMPLEX64, TensorProto.BOOL, TensorProto.INT8, TensorProto.FLOAT16, 0, 99]
OPS = [
    "Relu",
    "Conv",
    "Gemm",
    "Add",
    "Reshape",
    "Concat",
    "Softmax",
    "LSTM",
    "If",
    "Loop",
    "NonZero",
    "Resize",
    "Where",
    "TopK",
]


def _node(m, data):
    return m.graph.node[data.draw(st.integers(0, len(m.graph.node) - 1))] if len(m.graph.node) else None


def m_attr_type(m, data):
    n = _node(m, data)
    if n is None or not n.attribute:
        return "noop"
    a = n.attribute[data.draw(st.integers(0, len(n.attribute) - 1))]
    kind = data.draw(st.sampled_from(["string", "floats", "int", "ints", "graph", "tensor"]))
    name = a.name
    n.attribute.remove(a)
    value = {
        "string": "oops",
        "floats": [1.5, -2.0],
        "int": data.draw(st.sampled_from(HUGE + [3])),
        "ints": [data.draw(st.sampled_from(HUGE))] * 3,
        "graph": helper.make_graph([], "g", [], []),
        "tensor": numpy_helper.from_array(np.zeros(2, np.float32)),
    }[kind]
    n.attribute.append(helper.make_attribute(name, value))
    return f"attr {n.op_type}.{name} -> {kind}"


def m_drop_input(m, data):
    n = _node(m, data)
    if n is None or not n.input:
        return "noop"
    i = data.draw(st.integers(0, len(n.input) - 1))
    how = data.draw(st.sampled_from(["remove", "missing", "empty"]))
    if how == "remove":
        del n.input[i]
    else:
        n.input[i] = "nowhere" if how == "missing" else ""
    return f"input {i} of {n.op_type}: {how}"


def m_shape(m, data):
    """Inconsistent or huge shapes: in the declared input, or in an initializer's dims."""
    if data.draw(st.booleans()) and m.graph.initializer:
        init = m.graph.initializer[data.draw(st.integers(0, len(m.graph.initializer) - 1))]
        if init.dims:
            init.dims[data.draw(st.integers(0, len(init.dims) - 1))] = data.draw(st.sampled_from(HUGE + [1, 7]))
            return f"initializer {init.name} dims {list(init.dims)}"
    if not m.graph.input:
        return "noop"
    vi = m.graph.input[0]
    dims = vi.type.tensor_type.shape.dim
    choice = data.draw(st.sampled_from(["huge", "rank", "symbolic", "zero"]))
    if choice == "rank":
        dims.add().dim_value = 2
    elif dims:
        d = dims[data.draw(st.integers(0, len(dims) - 1))]
        if choice == "symbolic":
            d.dim_param = "S"
        else:
            d.dim_value = 0 if choice == "zero" else data.draw(st.sampled_from(HUGE[2:]))
    return f"input shape {choice}"


def m_cycle(m, data):
    if len(m.graph.node) < 2:
        return "noop"
    i = data.draw(st.integers(0, len(m.graph.node) - 2))
    later = m.graph.node[data.draw(st.integers(i + 1, len(m.graph.node) - 1))]
    if m.graph.node[i].input and later.output:
        m.graph.node[i].input[0] = later.output[0]
    return f"cycle node {i} <- {later.op_type}"


def m_domain(m, data):
    n = _node(m, data)
    if n is None:
        return "noop"
    if data.draw(st.booleans()):
        n.domain = data.draw(st.sampled_from(["com.evil", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview.training"]))
    else:
        n.op_type = data.draw(st.sampled_from(OPS + ["NoSuchOp"]))
    return f"{n.op_type} in domain {n.domain!r}"


def m_dtype(m, data):
    if not list(m.graph.input) + list(m.graph.output):
        return "noop"
    vi = data.draw(st.sampled_from(list(m.graph.input) + list(m.graph.output)))
    vi.type.tensor_type.elem_type = data.draw(st.sampled_from(ELEM_TYPES))
    return f"dtype of {vi.name}"


def m_opset(m, data):
    m.opset_import[0].version = data.draw(st.sampled_from([1, 6, 9, 13, 22, 99, 0]))
    return f"opset {m.opset_import[0].version}"


def m_duplicate(m, data):
    n = _node(m, data)
    if n is None:
        return "noop"
    m.graph.node.append(n)  # the same outputs written twice
    return f"duplicate {n.op_type}"


def m_outputs(m, data):
    if not m.graph.output:
        return "noop"
    if data.draw(st.booleans()):
        del m.graph.output[:]
        return "no outputs"
    m.graph.output[0].name = "not_produced"
    return "output not produced"


def m_attr_value(m, data):
    """Same attribute type, hostile value: passes the checker, reaches shape inference and TVM."""
    n = _node(m, data)
    if n is None or not n.attribute:
        return "noop"
    a = n.attribute[data.draw(st.integers(0, len(n.attribute) - 1))]
    vals = st.sampled_from([0, -1, -7, 1, 2, 3, 100, 2**31 - 1])
    if a.type == AttributeProto.INT:
        a.i = data.draw(vals)
    elif a.type == AttributeProto.INTS:
        a.ints[:] = data.draw(st.lists(vals, min_size=0, max_size=5))
    elif a.type == AttributeProto.FLOAT:
        a.f = data.draw(st.sampled_from([0.0, -1.0, float("inf"), float("nan"), 1e30]))
    return f"attr {n.op_type}.{a.name} value"


def m_const_value(m, data):
    """New values in an integer or float initializer, same dims (indices, shapes, scales)."""
    if not m.graph.initializer:
        return "noop"
    init = m.graph.initializer[data.draw(st.integers(0, len(m.graph.initializer) - 1))]
    try:
        a = numpy_helper.to_array(init)
    except ValueError:  # an earlier mutation already broke its dims
        return "noop"
    if a.dtype.kind in "iu":
        new = np.array(
            data.draw(st.lists(st.sampled_from([-3, -1, 0, 1, 2, 5, 1000, 2**40]), min_size=a.size, max_size=a.size)),
            a.dtype,
        ).reshape(a.shape)
    else:
        new = np.full(a.shape, data.draw(st.sampled_from([0.0, -1.0, float("nan"), float("inf"), 1e38])), a.dtype)
    init.CopyFrom(numpy_helper.from_array(new, init.name))
    return f"values of {init.name}"


MODEL_MUTATIONS = [
    m_attr_value,
    m_attr_value,
    m_const_value,
    m_const_value,
    m_attr_type,
    m_drop_input,
    m_shape,
    m_cycle,
    m_domain,
    m_dtype,
    m_opset,
    m_duplicate,
    m_outputs,
]


@st.composite
def broken_models(draw) -> tuple[str, bytes, list[str]]:
    """(seed name, model bytes, what was done). Sometimes the bytes themselves are damaged."""
    data = draw(st.data())
    name = draw(st.sampled_from(sorted(SEEDS)))
    m = SEEDS[name]()
    done = []
    for _ in range(draw(st.integers(1, 3))):
        done.append(data.draw(st.sampled_from(MODEL_MUTATIONS))(m, data))
    raw = m.SerializeToString()
    if draw(st.integers(0, 9)) == 0:
        pos = draw(st.integers(0, len(raw) - 1))
        raw = (
            raw[:pos] + bytes([raw[pos] ^ draw(st.integers(1, 255))]) + raw[pos + 1 :]
            if draw(st.booleans())
            else raw[:pos]
        )
        done.append(f"bytes damaged at {pos}")
    return name, raw, done


# ---- artifacts ----------------------------------------------------------------------------------


def _members(blob: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        return {n: z.read(n) for n in z.namelist()}


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    return buf.getvalue()


JSON_VALUES = [None, -1, 0, 2**63, 1e308, "x", "../../etc/passwd", [], {}, [1, 2], {"a": 1}, True]


def _mutate_json(doc, data, depth=0):
    if isinstance(doc, dict) and doc and depth < 4:
        key = data.draw(st.sampled_from(sorted(doc)))
        action = data.draw(st.sampled_from(["replace", "delete", "recurse", "recurse"]))
        if action == "delete":
            del doc[key]
        elif action == "replace":
            doc[key] = copy.deepcopy(data.draw(st.sampled_from(JSON_VALUES)))
        else:
            doc[key] = _mutate_json(doc[key], data, depth + 1)
        return doc
    if isinstance(doc, list) and doc and depth < 4:
        i = data.draw(st.integers(0, len(doc) - 1))
        if data.draw(st.booleans()):
            doc[i] = _mutate_json(doc[i], data, depth + 1)
        else:
            doc.append(copy.deepcopy(data.draw(st.sampled_from(JSON_VALUES))))
        return doc
    return copy.deepcopy(data.draw(st.sampled_from(JSON_VALUES)))  # a fresh object: no shared lists, no cycles


_SEED_ARTIFACT: list[bytes] = []


def set_seed_artifact(blob: bytes) -> None:
    """The artifact the mutations start from (kept out of the strategy's arguments: hypothesis
    would print all of it in every report)."""
    _SEED_ARTIFACT[:] = [blob]


@st.composite
def broken_artifacts(draw) -> tuple[bytes, list[str]]:
    blob = _SEED_ARTIFACT[0]
    data = draw(st.data())
    kind = draw(st.sampled_from(["bytes", "truncate", "manifest", "manifest", "weights", "member"]))
    if kind == "bytes":
        out = bytearray(blob)
        for _ in range(draw(st.integers(1, 8))):
            pos = draw(st.integers(0, len(out) - 1))
            out[pos] ^= draw(st.integers(1, 255))
        return bytes(out), ["bytes flipped"]
    if kind == "truncate":
        n = draw(st.integers(0, len(blob) - 1))
        return blob[:n], [f"truncated to {n}"]
    members = _members(blob)
    if kind == "manifest":
        doc = json.loads(members["manifest.json"])
        for _ in range(draw(st.integers(1, 3))):
            doc = _mutate_json(doc, data)
        members["manifest.json"] = json.dumps(doc).encode() if draw(st.integers(0, 9)) else b"{not json"
        return _zip(members), ["manifest edited"]
    if kind == "weights":  # consistent edit: new weights with checksums rewritten (data, not code)
        w = bytearray(members["weights.bin"])
        if w:
            w = w[: draw(st.integers(0, len(w)))] if draw(st.booleans()) else bytes(b ^ 0xFF for b in w)
        members["weights.bin"] = bytes(w)
        doc = json.loads(members["manifest.json"])
        import hashlib

        doc["members"]["weights.bin"] = {"sha256": hashlib.sha256(w).hexdigest(), "size": len(w)}
        members["manifest.json"] = json.dumps(doc).encode()
        return _zip(members), ["weights rewritten consistently"]
    name = draw(st.sampled_from(["../x", "/abs", "a/b", "manifest.json", "model.b9.so", "signature.json"]))
    members[name] = draw(st.binary(max_size=64))
    return _zip(members), [f"member {name!r} added"]
