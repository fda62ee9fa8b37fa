"""Per-kernel time of a zoo model compiled by Kiln (default options): where the milliseconds go.
Run by hand:  .venv/bin/python benchmarks/profile.py [mobilenet_v2|resnet50|...] [--runs 10] [--top 20]
Each kernel is timed by the VM's instrument hook (so the totals include the hook's overhead, a few
percent); the uninstrumented end-to-end median is printed first. With --isolated, each kernel is
instead timed alone, many times in a row (caches warm: its weights and activations in cache), and
the sum over the model's calls is set against the end-to-end time: what the kernels cost when memory
is not in the way, i.e. how much of the end-to-end time is waiting for memory."""

from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="mobilenet_v2")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--isolated", action="store_true", help="time each kernel alone (warm caches) instead")
    a = ap.parse_args(argv)
    import tvm
    from tvm import relax

    from kiln import zoo
    from kiln.compiler.executable import build_executable
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx

    opts = CompileOptions.make(input_shapes=[zoo.MODELS[a.model][1]])
    imported = import_onnx(zoo.build(a.model), opts.shapes)
    opt = optimize(imported.mod, opts)
    ex = build_executable(opt.mod, opts, a.model)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(imported.inputs[0].shape).astype("float32"))
    weights = [tvm.runtime.tensor(w) for w in opt.weights]
    for _ in range(3):
        vm["main"](x, *weights)
    ts = []
    for _ in range(a.runs):
        t = time.perf_counter()
        vm["main"](x, *weights)
        ts.append(time.perf_counter() - t)
    print(f"{a.model}: {np.median(ts) * 1e3:.2f} ms end to end (median of {a.runs})")
    if a.isolated:
        return isolated(opt.mod, ex, a.top)
    spent, calls, start = collections.Counter(), collections.Counter(), {}

    def hook(func, name, before, ret, *args):
        if before:
            start[name] = time.perf_counter()
        else:
            spent[name] += time.perf_counter() - start[name]
            calls[name] += 1
        return 0

    vm.set_instrument(hook)
    for _ in range(a.runs):
        vm["main"](x, *weights)
    total = sum(spent.values())
    for name, s in spent.most_common(a.top):
        print(f"{s / a.runs * 1e3:8.3f} ms {s / total * 100:5.1f}% {calls[name] // a.runs:3d}x  {name}")
    print(f"{total / a.runs * 1e3:8.3f} ms in {len(spent)} kernels (instrumented)")
    return 0


def isolated(mod, ex, top: int) -> int:
    """Each kernel alone (time_evaluator: 50 runs back to back, median of 5), times its calls."""
    import tvm

    from kiln.compiler import analysis

    calls = collections.Counter(analysis.kernels(mod))
    lib, dev, rng = ex.mod.imports[0], tvm.cpu(), np.random.default_rng(1)
    rows = []
    for gv, f in mod.functions.items():
        if gv.name_hint not in calls or not isinstance(f, tvm.tirx.PrimFunc):
            continue
        args = [
            tvm.runtime.tensor(
                rng.standard_normal([int(s) for s in p.shape]).astype(str(p.dtype))
                if "float" in str(p.dtype)
                else np.zeros([int(s) for s in p.shape], str(p.dtype)),
                dev,
            )
            for p in f.params
        ]
        t = float(np.median(lib.time_evaluator(gv.name_hint, dev, number=50, repeat=5)(*args).results))
        rows.append((t * calls[gv.name_hint], t, gv.name_hint))
    rows.sort(reverse=True)
    for total, t, name in rows[:top]:
        print(f"{total * 1e3:8.3f} ms {calls[name]:3d}x {t * 1e6:8.1f} us  {name}")
    print(f"{sum(r[0] for r in rows) * 1e3:8.3f} ms: the sum of {len(rows)} kernels alone, warm caches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
