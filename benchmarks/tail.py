"""Where kiln bench's tail latency comes from: per-run latencies of one zoo model under variants
of the runtime set-up, each in its own process (TVM's thread pool reads its environment once),
round-robin so that the machine's load drifts over every variant alike.

Per run it records, besides the latency, what happened to the process during that run: involuntary
context switches (a worker preempted by another process: the parallel-for waits for it), minor
page faults (first touch of buffers) and garbage collections. A slow run (> 2x the variant's p50)
is then attributed to what it saw, which measures the candidates instead of guessing.

    .venv/bin/python benchmarks/tail.py [--model mobilenet_v2] [--runs 200] [--rounds 3] [--json benchmarks/tail.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kiln.runtime.hostinfo import cpu_model_name

VARIANTS = {  # name: (env, options)
    "base": ({}, {}),
    "threads-1": ({}, {"threads": -1}),  # cores - 1: a neighbour preempting a worker no longer stalls the others
    "gc-off": ({}, {"gc_off": True}),
    "no-bind": ({"TVM_BIND_THREADS": "0"}, {}),
    "spin-0": ({"TVM_THREAD_POOL_SPIN_COUNT": "0"}, {}),
    "warmup-50": ({}, {"warmup": 50}),
    "ort": ({}, {"ort": True}),
}


def worker(artifact: str, onnx_path: str, runs: int, opts: dict) -> dict:
    """One variant, in this process: per-run latency, involuntary switches, minor faults, GCs."""
    from kiln.runtime.hostinfo import physical_cores

    cores = physical_cores()
    threads = cores - 1 if opts.get("threads") == -1 else cores
    threads = max(1, threads)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    if opts.get("ort"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        fn = lambda: sess.run(None, {"input": x})
    else:
        import kiln

        m = kiln.load(artifact, num_threads=threads)
        fn = lambda: m.run({"input": x})
    for _ in range(opts.get("warmup", 5)):
        fn()
    collections = [0]
    gc.callbacks.append(lambda phase, info: collections.__setitem__(0, collections[0] + (phase == "start")))
    if opts.get("gc_off"):
        gc.disable()
    rows = []
    for i in range(runs):
        r0, g0 = resource.getrusage(resource.RUSAGE_SELF), collections[0]
        t = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t) * 1e3
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        rows.append((ms, r1.ru_nivcsw - r0.ru_nivcsw, r1.ru_minflt - r0.ru_minflt, collections[0] - g0, i))
    gc.enable()
    return {"threads": threads, "rows": rows}


def summarize(rows: list) -> dict:
    a = np.array(rows, dtype=np.float64)
    ms = a[:, 0]
    p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    slow = ms > 2 * p50
    return {
        "runs": len(ms),
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": float(ms.max()),
        "p99_over_p50": p99 / p50,
        "slow_runs": int(slow.sum()),
        "slow_with_preemption": int((slow & (a[:, 1] > 0)).sum()),
        "slow_with_faults": int((slow & (a[:, 2] > 0)).sum()),
        "slow_with_gc": int((slow & (a[:, 3] > 0)).sum()),
        "slow_in_first_10_runs": int((slow & (a[:, 4] < 10)).sum()),
        "runs_with_preemption": int((a[:, 1] > 0).sum()),
        "p50_ms_preempted": float(np.median(ms[a[:, 1] > 0])) if (a[:, 1] > 0).any() else None,
        "p50_ms_not_preempted": float(np.median(ms[a[:, 1] == 0])) if (a[:, 1] == 0).any() else None,
        "gc_runs": int((a[:, 3] > 0).sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", default=str(Path(__file__).with_suffix(".json")))
    ap.add_argument("--worker", nargs=4, metavar=("ARTIFACT", "ONNX", "RUNS", "OPTS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], a.worker[1], int(a.worker[2]), json.loads(a.worker[3]))))
        return
    import onnx

    import kiln
    from kiln import zoo

    tmp = Path(tempfile.mkdtemp(prefix="kiln-tail-"))
    builder, shape = zoo.MODELS[a.model]
    model = builder()
    onnx.save(model, tmp / "m.onnx")
    t = time.perf_counter()
    kiln.compile(model, tmp / "m.kiln", input_shapes=[shape])
    print(f"compiled {a.model} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    names = a.variants.split(",")
    rows: dict[str, list] = {n: [] for n in names}
    threads: dict[str, int] = {}
    load = [os.getloadavg()[0]]
    for rnd in range(a.rounds):
        for n in names:
            env, opts = VARIANTS[n]
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                str(tmp / "m.kiln"),
                str(tmp / "m.onnx"),
                str(a.runs),
                json.dumps(opts),
            ]
            out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows[n] += r["rows"]
            threads[n] = r["threads"]
            load.append(os.getloadavg()[0])
        print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr)
    result = {
        "model": a.model,
        "cpu": cpu_model_name(),
        "cpus": os.cpu_count(),
        "loadavg_1min": load,
        "variants": {n: {"threads": threads[n], "env": VARIANTS[n][0], **summarize(rows[n])} for n in names},
    }
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{a.model} on {result['cpu']} ({result['cpus']} CPUs), load average {min(load):.1f}-{max(load):.1f}")
    print(
        "| variant | threads | p50 ms | p99 ms | max ms | p99/p50 | slow (>2x p50) | ...preempted | ...faults "
        "| ...gc "
        "| ...in a process's first 10 runs | p50 preempted / not |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in names:
        v = result["variants"][n]
        pre = (
            f"{v['p50_ms_preempted']:.2f} / {v['p50_ms_not_preempted']:.2f}"
            if v["p50_ms_preempted"] is not None and v["p50_ms_not_preempted"] is not None
            else "-"
        )
        print(
            f"| {n} | {v['threads']} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | {v['max_ms']:.2f} "
            f"| {v['p99_over_p50']:.2f} | {v['slow_runs']}/{v['runs']} | {v['slow_with_preemption']} "
            f"| {v['slow_with_faults']} | {v['slow_with_gc']} "
            f"| {v['slow_in_first_10_runs']} | {pre} |"
        )


if __name__ == "__main__":
    main()
