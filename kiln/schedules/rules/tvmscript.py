"""TVMScript parsed while Kiln runs: each @T.prim_func calls inspect.stack(), which looks up every
frame's module by scanning sys.modules (inspect.getmodule). In a process that has loaded PyTorch,
onnxruntime and Kiln that scan dominates the parse of Kiln's int8 intrinsics, more so in a pytest
worker, and TVM's own tensor intrinsics package (hundreds of functions) took far longer (timings in
benchmarks/history.md and benchmarks/tail.md).
cheap_stack() swaps inspect.stack for an equivalent without the lookup while TVMScript is parsed."""

from __future__ import annotations

import contextlib
import inspect
import linecache
import sys
import threading

_LOCK = threading.Lock()


def _frames(context: int = 1) -> list:
    """inspect.stack() without its per-frame module lookup: the same frames, file names, line
    numbers and one line of context each."""
    out, f = [], sys._getframe(1)
    while f is not None:
        name, line = f.f_code.co_filename, f.f_lineno
        text = linecache.getline(name, line)
        out.append(inspect.FrameInfo(f, name, line, f.f_code.co_name, [text] if text else None, 0 if text else None))
        f = f.f_back
    return out


@contextlib.contextmanager
def cheap_stack():
    """inspect.stack is _frames inside the block (one block at a time: the swap is process-wide)."""
    with _LOCK:
        stack, inspect.stack = inspect.stack, _frames
        try:
            yield
        finally:
            inspect.stack = stack


INTRINSICS = "tvm.s_tir.tensor_intrin"
# the modules of TVM's tensor intrinsics package a target kind can use; its __init__ imports every one,
# CUDA's and ROCm's (most of its import time) for a CPU target too
INTRINSICS_BY_KIND = {"llvm": ("dot_product_common", "x86", "arm_cpu", "riscv_cpu"), "cuda": ("cuda",)}


def import_tensor_intrinsics(kind: str = "llvm") -> None:
    """Register TVM's tensor intrinsics for a target kind before MetaSchedule's TuneContext imports
    them (`import tvm.s_tir.tensor_intrin`: every target's). The package is entered without its
    __init__ and only this kind's modules are imported (another kind's when it is tuned in the same
    process; an unknown kind's: all of them)."""
    import importlib
    import importlib.util
    import pkgutil

    import tvm.s_tir

    pkg = sys.modules.get(INTRINSICS)
    if pkg is None:
        pkg = importlib.util.module_from_spec(importlib.util.find_spec(INTRINSICS))
        sys.modules[INTRINSICS] = tvm.s_tir.tensor_intrin = pkg
    names = INTRINSICS_BY_KIND.get(kind) or [m.name for m in pkgutil.iter_modules(pkg.__path__)]
    with cheap_stack():
        for name in names:
            importlib.import_module(f"{INTRINSICS}.{name}")
