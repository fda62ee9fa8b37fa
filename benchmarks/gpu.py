"""The zoo on an NVIDIA GPU against onnxruntime-gpu (CUDAExecutionProvider), same input, medians
after warm-up. Run through benchmarks/gpu.sh, which skips cleanly on a host without a GPU.
Kiln's GPU kernels are dlight's default schedules (convolutions on the generic fallback) unless
records from `kiln tune` on the GPU host are given with --tuning-db."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from report import save, table

import kiln
from kiln import zoo


def compute_capability() -> str:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    )
    cap, name = [x.strip() for x in out.stdout.splitlines()[0].split(",", 1)]
    return "sm_" + cap.replace(".", ""), name


def median_ms(fn, warmup=5, runs=50) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(sorted(zoo.MODELS)))
    ap.add_argument("--tuning-db", default=None)
    ap.add_argument("--out", default="benchmarks/gpu")
    a = ap.parse_args(argv)
    arch, gpu = compute_capability()
    import onnxruntime as ort

    providers = ort.get_available_providers()
    tmp = Path(tempfile.mkdtemp(prefix="kiln-gpu-"))
    rows = []
    for name in a.models.split(","):
        build, shape = zoo.MODELS[name]
        src = tmp / f"{name}.onnx"
        onnx.save(build(), src)
        kiln.compile(
            src, tmp / f"{name}.kiln", input_shapes=[shape], target=f"cuda -arch={arch}", tuning_db=a.tuning_db
        )
        m = kiln.load(tmp / f"{name}.kiln")
        x = np.random.default_rng(0).standard_normal(m.inputs[0].shape).astype(np.float32)
        feed = {m.inputs[0].name: x}
        ours = m.run(feed)[m.outputs[0].name]
        row = {"model": name, "kiln_ms": median_ms(lambda m=m, feed=feed: m.run(feed))}
        if "CUDAExecutionProvider" in providers:
            s = ort.InferenceSession(str(src), providers=["CUDAExecutionProvider"])
            ref = s.run(None, feed)[0]
            row |= {
                "ort_gpu_ms": median_ms(lambda s=s, feed=feed: s.run(None, feed)),
                "max_abs_diff": float(np.abs(ours - ref).max()),
            }
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    lines = [
        f"Kiln {kiln.__version__} on {gpu} ({arch}), batch 1, medians of 50 runs after 5 warm-up "
        "(host<->device copies included).",
        "",
    ]
    lines += table(
        ["model", "kiln ms", "onnxruntime-gpu ms", "kiln/ort", "max abs diff"],
        [
            [
                r["model"],
                f"{r['kiln_ms']:.2f}",
                f"{r.get('ort_gpu_ms', float('nan')):.2f}",
                f"{r['kiln_ms'] / r['ort_gpu_ms']:.2f}x" if "ort_gpu_ms" in r else "-",
                f"{r.get('max_abs_diff', float('nan')):.1e}",
            ]
            for r in rows
        ],
    )
    if "CUDAExecutionProvider" not in providers:
        lines += ["", "onnxruntime-gpu is not installed: Kiln only (pip install onnxruntime-gpu for the comparison)."]
    save(a.out, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
