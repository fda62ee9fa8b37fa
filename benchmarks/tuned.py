"""Tuned vs untuned against onnxruntime, same run: each zoo model compiled twice (default
schedules only, and with the records shipped in tuning_logs/ for this target), both benchmarked
beside onnxruntime (`kiln bench` semantics). Run by hand:
    .venv/bin/python benchmarks/tuned.py [--models resnet50,mobilenet_v2] [--threads 2] [--seconds 8] [--tuning-db DIR]
        [--out benchmarks/tuned]"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import onnx

import kiln
from kiln import zoo
from kiln.runtime.bench import BenchOptions, bench
from report import save, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,mobilenet_v2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--tuning-db", default=None, help="records to compare (default: those shipped in tuning_logs/ for this target)")
    ap.add_argument("--out", default="benchmarks/tuned")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kiln-tuned-"))
    rows = []
    for name in a.models.split(","):
        build, shape = zoo.MODELS[name]
        onnx_path = tmp / f"{name}.onnx"
        onnx.save(build(), onnx_path)
        for label, db in (("untuned", "none"), ("tuned", a.tuning_db)):
            art = tmp / f"{name}-{label}.kiln"
            r = kiln.compile(onnx_path, art, input_shapes=[shape], tuning_db=db)
            b = bench(art, BenchOptions(threads=a.threads, warmup=5, seconds=a.seconds, onnx=str(onnx_path)))
            row = {"model": name, "schedules": label, "tuned_coverage": r.report.get("tuned_coverage", 0.0),
                   "tuned_kernels": r.report.get("tuned_kernels", 0), "kernels": r.report["kernels"],
                   **{k: round(v, 3) for k, v in b.items() if k in ("p50_ms", "p99_ms", "ort_p50_ms", "ort_p99_ms", "ratio_p50")},
                   "max_abs_diff": b["max_abs_diff"]}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    lines = [f"Kiln {kiln.__version__}, {a.threads} threads, batch 1: default schedules vs the records in tuning_logs/, each beside "
             "onnxruntime in the same run (`benchmarks/tuned.py`).", ""]
    lines += table(["model", "schedules", "tuned coverage", "kiln p50 ms", "ort p50 ms", "kiln/ort p50", "max abs diff"],
                   [[r["model"], r["schedules"], f"{r['tuned_coverage']:.0%}", f"{r['p50_ms']:.2f}", f"{r['ort_p50_ms']:.2f}",
                     f"{r['ratio_p50']:.2f}x", f"{r['max_abs_diff']:.1e}"] for r in rows])
    save(a.out, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
