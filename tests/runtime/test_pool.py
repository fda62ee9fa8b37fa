"""Kiln's thread pool (kiln/runtime/pool.c) runs a loaded CPU artifact's parallel loops in place of
TVM's: installed in the library, equal results, and its worker threads exist."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import helper

import kiln
from kiln.runtime import pool
from tests.helpers import make_model, rand


def _conv_model():
    return make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        {"x": rand(1, 16, 32, 32)},
        ["y"],
        {"w": rand(32, 16, 3, 3, seed=1)},
    )


def _pool_threads() -> int:
    return sum(1 for t in Path("/proc/self/task").iterdir() if (t / "comm").read_text().strip() == "kiln-pool")


def test_parallel_loops_run_on_kilns_pool(tmp_path, monkeypatch):
    kiln.compile(_conv_model(), tmp_path / "m.kiln")
    x = {"x": rand(1, 16, 32, 32, seed=5)}
    monkeypatch.setenv(pool.ENV, "tvm")
    before = len(pool._libraries)
    ref = kiln.load(tmp_path / "m.kiln", num_threads=2).run(x)["y"]
    assert len(pool._libraries) == before  # KILN_THREAD_POOL=tvm: TVM's pool
    monkeypatch.delenv(pool.ENV)
    model = kiln.load(tmp_path / "m.kiln", num_threads=2)
    assert len(pool._libraries) == before + 1 and pool.active()
    import ctypes

    assert ctypes.c_void_p.in_dll(pool._libraries[-1], "__TVMBackendParallelLaunch").value == pool._launch
    for _ in range(3):
        np.testing.assert_array_equal(model.run(x)["y"], ref)  # any chunking: the same arithmetic
    assert _pool_threads() >= 1  # the caller runs chunks too: one worker for 2 threads


def test_a_forked_child_runs_on_its_own_pool(tmp_path):
    """The child of a fork has none of the parent's workers: it starts its own and gets the same result."""
    import os

    kiln.compile(_conv_model(), tmp_path / "m.kiln")
    model = kiln.load(tmp_path / "m.kiln", num_threads=2)
    x = {"x": rand(1, 16, 32, 32, seed=6)}
    ref = model.run(x)["y"]  # the parent's workers exist now
    pid = os.fork()
    if pid == 0:  # the child: any failure is its exit code
        ok = all(np.array_equal(model.run(x)["y"], ref) for _ in range(5)) and _pool_threads() >= 1
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
