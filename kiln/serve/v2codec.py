"""The Open Inference Protocol's (KServe V2) infer bodies, with the binary tensor data extension.

A request is a JSON header, optionally followed by raw tensors: `Inference-Header-Content-Length` says
where the JSON ends, and each input whose `parameters.binary_data_size` is set takes that many bytes
of what follows, in input order. The answer is built the same way: outputs asked for with
`binary_data` (or every output, with the request's `binary_data_output`) go as raw bytes after the
JSON. Every malformed body is an InputError (400), naming the input and what the model expects."""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import numpy as np

from ..errors import InputError

# numpy dtype name -> V2 datatype; BYTES (strings) has no Kiln model to feed
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
}
WHERE = "V2 infer request"


@functools.lru_cache(maxsize=64)
def datatype(dtype) -> str:
    """The V2 datatype of a numpy dtype (or dtype name); cached: np.dtype(...).name is slow (benchmarks/history.md)."""
    return DATATYPES.get(np.dtype(dtype).name, str(dtype).upper())


@dataclasses.dataclass
class Request:
    id: object  # echoed as sent; None: not sent
    feed: dict[str, np.ndarray]
    outputs: list[str] | None  # names asked for, in order; None: every output
    binary: dict[str, bool]  # output name -> answer it as raw bytes
    binary_default: bool


def _bad(message: str, fix: str) -> InputError:
    return InputError(message, where=WHERE, fix=fix)


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """-> (the JSON header, the binary tensor data after it)."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 <= n <= len(body):
        raise _bad(
            f"Inference-Header-Content-Length is {header_length!r}, the body has {len(body)} bytes",
            "send the length in bytes of the JSON header, which the body starts with",
        )
    return body[:n], memoryview(body)[n:]


def _json(header: bytes) -> dict:
    try:
        doc = json.loads(header)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise _bad(f"the header is not valid JSON ({type(e).__name__}: {e})", 'send {"inputs": [...]}') from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise _bad('the header needs an "inputs" list', 'send {"inputs": [{"name", "shape", "datatype", "data"}]}')
    return doc


def _params(obj: dict, what: str) -> dict:
    p = obj.get("parameters", {})
    if not isinstance(p, dict):
        raise _bad(f'{what}: "parameters" is not an object', 'send "parameters": {...}')
    return p


def _shape(t: dict, name: str) -> tuple[int, ...]:
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 2**40 for d in shape):
        raise _bad(f"input {name!r}: shape {shape!r} is not a list of dims", 'send e.g. "shape": [1, 3, 224, 224]')
    return tuple(shape)


def _binary(raw: memoryview, offset: int, size, dtype: np.dtype, shape, name: str) -> np.ndarray:
    count = math.prod(shape)  # Python ints: huge dims never wrap
    if type(size) is not int or size != count * dtype.itemsize:
        raise _bad(
            f"input {name!r}: binary_data_size is {size!r}, shape {list(shape)} of {datatype(dtype)} needs "
            f"{count * dtype.itemsize} bytes",
            "send the tensor's raw bytes, row-major, and their count",
        )
    if offset + size > len(raw):
        raise _bad(
            f"input {name!r}: the body ends {offset + size - len(raw)} bytes short of its binary data",
            "send every binary input's bytes after the JSON header",
        )
    return np.frombuffer(raw[offset : offset + size], dtype=dtype).reshape(shape)


def _json_data(data, dtype: np.dtype, shape, name: str) -> np.ndarray:
    try:
        a = np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise _bad(
            f"input {name!r}: data is not a rectangular array of numbers ({e})", "send flat or nested lists"
        ) from None
    if a.size != math.prod(shape):
        raise _bad(f"input {name!r}: {a.size} values for shape {list(shape)}", "send one value per element")
    return a.reshape(shape)


def _input(t, raw: memoryview, offset: int, dtypes: dict[str, np.dtype]) -> tuple[str, np.ndarray, int]:
    """One input tensor -> (name, array, bytes of binary data it took)."""
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise _bad("an input has no name", 'send {"name", "shape", "datatype", "data"} per input')
    name = t["name"]
    if name not in dtypes:
        raise _bad(f"unknown input {name!r}", f"the model's inputs are {list(dtypes)}")
    dtype, shape = dtypes[name], _shape(t, name)
    if t.get("datatype") != datatype(dtype):
        raise _bad(f"input {name!r} has datatype {t.get('datatype')!r}", f"the model expects {datatype(dtype)}")
    size = _params(t, f"input {name!r}").get("binary_data_size")
    if size is not None:
        return name, _binary(raw, offset, size, dtype, shape, name), size
    if "data" not in t:
        raise _bad(f"input {name!r} has neither data nor binary_data_size", 'send "data": [...]')
    return name, _json_data(t["data"], dtype, shape, name), 0


def _outputs(doc: dict, names: list[str]) -> tuple[list[str] | None, dict[str, bool]]:
    wanted = doc.get("outputs")
    if wanted is None:
        return None, {}
    if not isinstance(wanted, list):
        raise _bad('"outputs" is not a list', 'send "outputs": [{"name": ...}]')
    order, binary = [], {}
    for o in wanted:
        name = o.get("name") if isinstance(o, dict) else None
        if name not in names:
            raise _bad(f"unknown output {name!r}", f"the model's outputs are {names}")
        order.append(name)
        flag = _params(o, f"output {name!r}").get("binary_data")
        if flag is not None:
            binary[name] = bool(flag)
    return order, binary


def decode(body: bytes, header_length: str | None, inputs, outputs) -> Request:
    """inputs, outputs: the model's TensorSpecs. Shapes are checked against the buckets later."""
    header, raw = split_body(body, header_length)
    return decode_doc(_json(header), raw, inputs, outputs)


def decode_doc(doc: dict, raw: memoryview, inputs, outputs) -> Request:
    """The parsed JSON header and the binary data after it (gRPC builds both from its message)."""
    dtypes = {s.name: np.dtype(s.dtype) for s in inputs}
    feed, offset = {}, 0
    for t in doc["inputs"]:
        name, array, used = _input(t, raw, offset, dtypes)
        if name in feed:
            raise _bad(f"input {name!r} is given twice", "send each input once")
        feed[name], offset = array, offset + used
    if offset != len(raw):
        raise _bad(f"{len(raw) - offset} bytes of binary data no input claims", "give each binary input its size")
    order, binary = _outputs(doc, [s.name for s in outputs])
    default = _params(doc, "request").get("binary_data_output", False)
    return Request(doc.get("id"), feed, order, binary, bool(default))


def encode(req: Request, model: str, version: str, results: dict[str, np.ndarray]) -> tuple[bytes, int | None]:
    """-> (body, JSON header length when binary outputs follow it, else None)."""
    tensors, chunks = [], []
    for name in req.outputs or list(results):
        a = np.ascontiguousarray(results[name])
        t = {"name": name, "datatype": datatype(a.dtype), "shape": list(a.shape)}
        if req.binary.get(name, req.binary_default):
            chunks.append(a.tobytes())
            t["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            t["data"] = a.ravel().tolist()
        tensors.append(t)
    doc = {"model_name": model, "model_version": version, "outputs": tensors}
    if req.id is not None:
        doc["id"] = req.id
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
