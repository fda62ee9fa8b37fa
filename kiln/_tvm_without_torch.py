"""Import TVM without PyTorch. tvm_ffi imports torch whenever it is installed (for torch tensor and dtype
interop Kiln does not use: Kiln hands TVM numpy arrays, and TVM's PyTorch frontend passes tensors over
DLPack), and so does tvm.relax (base_py_module, for its PyTorch-facing modules). That is most of the
start-up of every process that imports TVM (the CLI, each tuning worker, each test subprocess; timings in
benchmarks/history.md). Where torch is not loaded yet, the first import of tvm (or of tvm_ffi, whichever
comes first) sees it as absent; `import torch` works as usual afterwards (the .pt2 frontend). Where
it is loaded already (a user compiling a torch.nn.Module), tvm_ffi imports it as before."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

HIDDEN = "torch"
PACKAGES = {"tvm", "tvm_ffi"}  # the first import of each runs with torch hidden


class _HidingLoader(importlib.abc.Loader):
    """The package's own loader, run with torch marked absent in sys.modules."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):  # resource readers and the like: the real loader's
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        hide = HIDDEN not in sys.modules
        if hide:
            sys.modules[HIDDEN] = None  # `import torch` raises ImportError, which tvm_ffi expects without torch
        try:
            self._inner.exec_module(module)
        finally:
            if hide and HIDDEN in sys.modules and sys.modules[HIDDEN] is None:
                del sys.modules[HIDDEN]


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in PACKAGES:
            return None
        PACKAGES.discard(name)  # once each: later imports find the package in sys.modules
        if not PACKAGES:
            uninstall()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and HIDDEN not in sys.modules:
            spec.loader = _HidingLoader(spec.loader)
        return spec


_FINDER = _Finder()


def install() -> None:
    """Before TVM's first import (kiln/__init__); a no-op once tvm and tvm_ffi are loaded."""
    PACKAGES.difference_update(sys.modules)
    if PACKAGES and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
