"""TVMScript parsed while Kiln runs: each @T.prim_func calls inspect.stack(), which looks up every
frame's module by scanning sys.modules (inspect.getmodule). In a process that has loaded PyTorch,
onnxruntime and Kiln that scan dominates: registering Kiln's six int8 intrinsics took 1.5 s with
torch imported and 0.2 s with cheap_stack (Zen 4), and in a pytest worker far more; TVM's own
tensor intrinsics package (hundreds of functions) took tens of seconds (benchmarks/tail.md).
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
