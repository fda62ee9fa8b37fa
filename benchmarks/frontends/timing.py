"""Timing shared by the frontends benchmarks (run.py, tflite_models.py)."""

from __future__ import annotations

import time

import numpy as np


def p50s(fns: dict, runs: int, block: int = 5) -> dict:
    """p50 ms of each callable, timed in alternating blocks of `block` runs so every path sees the same
    machine load (their ratios are what a shared machine can measure). Each block starts with one untimed
    run: a thread pool the previous path left spinning (onnxruntime's, TVM's) does not land on the next."""
    times = {k: [] for k in fns}
    for _ in range(max(1, runs // block)):
        for k, f in fns.items():
            f()
            for _ in range(block):
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
    return {k: round(float(np.median(v)) * 1e3, 3) for k, v in times.items()}
