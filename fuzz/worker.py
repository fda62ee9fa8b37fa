"""Runs fuzz cases sent by the parent: frames of (4-byte kind length, kind, 4-byte length, payload)
on stdin; one JSON line per case on stdout. A case ends as ok, kiln_error (a KilnError: what we
want for bad input) or other (any other exception: a bug). Crashes and hangs are seen by the parent."""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

MEMORY_LIMIT = 12 << 30  # address space: a runaway allocation becomes a MemoryError, not the OOM killer


def _read_exact(f, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def run_model(raw: bytes, tmp: Path, suffix: str = ".onnx") -> str:
    import numpy as np

    import kiln

    src, out = tmp / f"m{suffix}", tmp / "m.kiln"
    src.write_bytes(raw)
    kiln.compile(src, out)
    m = kiln.load(out)
    res = m.run({s.name: np.zeros(s.shape, s.dtype) for s in m.inputs})
    return f"ran: {len(res)} outputs"


def run_artifact(raw: bytes, tmp: Path) -> str:
    import numpy as np

    import kiln

    p = tmp / "a.kiln"
    p.write_bytes(raw)
    m = kiln.load(p)
    res = m.run({s.name: np.zeros(s.shape, s.dtype) for s in m.inputs})
    return f"ran: {len(res)} outputs"


def run_v2(raw: bytes) -> str:
    """A V2 infer body through the server's codec, then its answer encoded back."""
    import struct

    import numpy as np

    from kiln.serve import v2codec

    from .v2 import INPUTS, NO_HEADER, OUTPUTS

    (n,) = struct.unpack("<I", raw[:4])
    req = v2codec.decode(raw[4:], None if n == NO_HEADER else str(n), INPUTS, OUTPUTS)
    body, _ = v2codec.encode(req, "m", "v1", {"y": req.feed.get("x", np.zeros((2, 3), np.float32))})
    return f"decoded: {sorted(req.feed)}, {len(body)} bytes back"


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    warnings.simplefilter("ignore")
    stdout = os.fdopen(os.dup(1), "w")  # the protocol channel; anything else printing (TVM, C code) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import kiln

    stdin = sys.stdin.buffer
    with tempfile.TemporaryDirectory(prefix="kiln-fuzz-") as d:
        while True:
            try:
                (n,) = struct.unpack("<I", _read_exact(stdin, 4))
                kind = _read_exact(stdin, n).decode()
                (n,) = struct.unpack("<I", _read_exact(stdin, 4))
                payload = _read_exact(stdin, n)
            except EOFError:
                return 0
            tmp = Path(tempfile.mkdtemp(dir=d))
            if kind == "selftest-crash":  # the harness's own test: a native crash
                os.abort()
            if kind == "selftest-hang":
                import time

                time.sleep(3600)
            try:
                if kind == "v2":
                    detail = run_v2(payload)
                elif kind in ("pt2", "tflite"):  # the other frontends' readers, through the same compile
                    detail = run_model(payload, tmp, f".{kind}")
                else:
                    detail = (run_model if kind == "model" else run_artifact)(payload, tmp)
                result = {"outcome": "ok", "detail": detail}
            except kiln.KilnError as e:
                result = {"outcome": "kiln_error", "type": type(e).__name__, "detail": str(e)[:300]}
            except BaseException as e:
                result = {
                    "outcome": "other",
                    "type": type(e).__name__,
                    "detail": str(e)[:300],
                    "traceback": traceback.format_exc()[-2000:],
                }
            stdout.write(json.dumps(result) + "\n")
            stdout.flush()
            for f in tmp.iterdir():
                f.unlink()
            os.rmdir(tmp)


if __name__ == "__main__":
    sys.exit(main())
