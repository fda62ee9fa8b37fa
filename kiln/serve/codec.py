"""Request and response bodies: JSON `{"inputs": {name: nested lists}}` -> `{"outputs": {...}}`, or
an .npz body (keys = input names) answered with an .npz of the outputs."""

from __future__ import annotations

import io
import json

import numpy as np

from ..errors import InputError

NPZ_TYPES = ("application/x-npz", "application/npz", "application/octet-stream")


def is_npz(content_type: str) -> bool:
    return content_type in NPZ_TYPES


def decode(body: bytes, content_type: str, specs) -> dict[str, np.ndarray]:
    """-> {input name: array} in the model's dtypes. Raises InputError on anything malformed."""
    dtypes = {s.name: np.dtype(s.dtype) for s in specs}
    if is_npz(content_type):
        try:
            with np.load(io.BytesIO(body), allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except Exception as e:
            raise InputError(
                f"body is not a valid .npz ({type(e).__name__}: {e})",
                where="request body",
                fix="send np.savez output, keys = input names",
            ) from None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(
            f"body is not valid JSON ({e})", where="request body", fix='send {"inputs": {"<input name>": [[...]]}}'
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
        raise InputError(
            'JSON body needs an "inputs" object', where="request body", fix='send {"inputs": {"<input name>": [[...]]}}'
        )
    feed = {}
    for name, value in doc["inputs"].items():
        if name not in dtypes:
            raise InputError(
                f"unknown input {name!r}", where="request body", fix=f"the model's inputs are {list(dtypes)}"
            )
        try:
            feed[name] = np.asarray(value, dtype=dtypes[name])
        except (ValueError, TypeError, OverflowError) as e:
            raise InputError(
                f"input {name!r} is not a rectangular array of numbers ({e})",
                where="request body",
                fix="send nested lists of equal lengths",
            ) from None
    return feed


def encode(outputs: dict[str, np.ndarray], as_npz: bool) -> tuple[bytes, str]:
    if as_npz:
        buf = io.BytesIO()
        np.savez(buf, **outputs)
        return buf.getvalue(), "application/x-npz"
    return json.dumps({"outputs": {k: v.tolist() for k, v in outputs.items()}}).encode(), "application/json"
