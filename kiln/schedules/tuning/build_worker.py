"""The side of `kiln tune`'s build worker (kiln/schedules/tuning/builder.py) that runs in the worker
process. It imports nothing heavy at module level: a spawned worker imports this module first,
and its start-up is waited for inside --budget.

The worker never needs PyTorch, but importing TVM imports it when it is installed (tvm_ffi tries
`import torch` first, for a symbol conflict seen on Windows), a large share of its start-up (timings
in benchmarks/history.md). serve() hides it from the worker before TVM is imported."""

from __future__ import annotations

import os
import sys
import tempfile
import uuid


def compile_candidate(mod_json: str, target: dict, out_dir: str) -> str:
    """In the worker: TVM JSON -> shared library in its own folder under out_dir; returns its path."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(tvm.ir.load_json(mod_json))
    lib = tvm.compile(mod, target=tvm.target.Target(target))
    path = os.path.join(tempfile.mkdtemp(dir=out_dir), f"{uuid.uuid4().hex}.so")
    lib.export_library(path)
    return path


def serve(conn, build) -> None:
    """The worker's loop: (mod_json, target, out_dir) in, ("ok", path) or ("error", text) out. It
    answers "ready" once TVM is imported, so a candidate's time limit never covers the import."""
    sys.modules.setdefault("torch", None)  # `import torch` now raises ImportError, which tvm_ffi skips
    import tvm  # noqa: F401
    from tvm.s_tir import transform  # noqa: F401

    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", build(*job)))
        except Exception as e:  # an invalid candidate: reported, the worker lives on
            conn.send(("error", f"{type(e).__name__}: {e}"))
