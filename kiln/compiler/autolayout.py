"""--layout auto: build the model in each candidate layout, time it on this host (warm-up, then
the median of a few runs), keep the fastest. Costs one extra build per candidate."""

from __future__ import annotations

import statistics
import time

import numpy as np

from .passes.convert_layout import LAYOUTS, has_conv2d

MAX_SECONDS_PER_CANDIDATE = 3.0


def time_executable(
    exe, weights, input_specs, max_seconds: float = MAX_SECONDS_PER_CANDIDATE, max_runs: int = 7
) -> float:
    import tvm
    from tvm.runtime.vm import VirtualMachine

    dev = tvm.cpu()
    vm = VirtualMachine(exe, dev)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype(d), dev) for s, d in input_specs]
    args += [tvm.runtime.tensor(w, dev) for w in weights]
    vm["main"](*args)  # warm-up
    times, start = [], time.perf_counter()
    while len(times) < max_runs and (len(times) < 2 or time.perf_counter() - start < max_seconds):
        t = time.perf_counter()
        vm["main"](*args)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def choose_layout(mod, options, where: str) -> tuple[str, dict[str, float]]:
    from .executable import build_executable
    from .hostrun import require_host_runs
    from .optimize import optimize

    if not has_conv2d(mod):
        return "NCHW", {}
    require_host_runs(
        options.target,
        "--layout auto",
        "--layout",
        "pick a layout yourself (--layout NCHWc is the default), or compile on a machine of the target's kind",
    )
    f = mod["main"]
    specs = [([int(v) for v in p.ty.shape.values], str(p.ty.dtype)) for p in f.params]
    results = {}
    for layout in LAYOUTS:
        opt = optimize(mod, options, layout=layout)
        results[layout] = round(time_executable(build_executable(opt.mod, options, where), opt.weights, specs), 3)
    return min(results, key=results.get), results
