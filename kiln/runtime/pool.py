"""Kiln's thread pool (pool.c) in place of TVM's for a loaded artifact library.

Every CPU artifact library links pool.c. After TVM has loaded a library, `install` points the
library's parallel loops (its `__TVMBackendParallelLaunch`) at the process's one Kiln pool: the
first library's `kiln_pool_launch`, which stays loaded for the life of the process. The pool hands
out a loop's chunks one at a time, so a worker thread the OS has descheduled (another process on
its core) costs at most the chunks it holds, not a time slice per kernel (benchmarks/tail.md).
Libraries built before the pool existed, or that use TVM's parallel barrier, keep TVM's pool, as
does every library when KILN_THREAD_POOL=tvm."""

from __future__ import annotations

import ctypes
import os
import threading

from .. import env

ENV = env.THREAD_POOL  # "tvm": keep TVM's own pool
SPIN_US = 200  # an idle worker spins this long for the next parallel loop, then sleeps

_lock = threading.Lock()
_pool = None  # the library whose pool the process uses (kept loaded)
_launch: int | None = None
_threads = 1
_libraries: list = []  # every library pointed at the pool: kept loaded while their loops may run


def _symbol(lib, name: str):
    try:
        return lib[name]
    except AttributeError:
        return None


def install(lib_path) -> bool:
    """Point the parallel loops of the library TVM loaded from lib_path at Kiln's pool; False where
    the library keeps TVM's (no pool in it, it uses TVM's parallel barrier, or KILN_THREAD_POOL=tvm)."""
    global _pool, _launch
    if env.tvm_thread_pool():
        return False
    try:  # the copy TVM loaded: RTLD_NOLOAD never loads a second one
        lib = ctypes.CDLL(str(lib_path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    launch = _symbol(lib, "kiln_pool_launch")
    if launch is None or _symbol(lib, "__TVMBackendParallelBarrier") is not None:
        return False
    try:  # this library's own pointer (dlsym on its handle), which TVM's loader set to its pool
        slot = ctypes.c_void_p.in_dll(lib, "__TVMBackendParallelLaunch")
    except ValueError:  # no parallel loop in the library
        return False
    with _lock:
        if _pool is None:
            _pool, _launch = lib, ctypes.cast(launch, ctypes.c_void_p).value
            _configure(_threads)
        slot.value = _launch
        _libraries.append(lib)
    return True


def _configure(threads: int) -> None:
    fn = _pool.kiln_pool_configure
    fn.argtypes = [ctypes.c_int, ctypes.c_long]
    fn(threads, SPIN_US)


def configure(threads: int) -> None:
    """Run parallel loops on `threads` threads, the caller included."""
    global _threads
    with _lock:
        _threads = threads
        if _pool is not None:
            _configure(threads)


def active() -> bool:
    """Whether some library in this process runs on Kiln's pool."""
    return _pool is not None
