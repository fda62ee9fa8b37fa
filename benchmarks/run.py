"""The zoo against onnxruntime on this machine: every model compiled by Kiln with default options,
untuned (`--tuning-db none`: default schedules only) and tuned (the records Kiln ships in
tuning_logs/ for this target, when there are any), benchmarked with `kiln bench` semantics (same
input, Kiln and onnxruntime alternating, warm-up first) for 1 and 2 threads. Writes a markdown
table and JSON. Run by hand:
    .venv/bin/python benchmarks/run.py [--models a,b] [--threads 1,2] [--seconds 8] [--out benchmarks/results]
With `--precisions fp32,bf16` the tuned build also runs with `--precision bf16` (a "precision" column;
onnxruntime stays float32, so those rows compare a bf16 Kiln against a float32 onnxruntime)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import onnx
from report import save, table

import kiln
from kiln import zoo
from kiln.compiler import CompileOptions
from kiln.runtime.bench import BenchOptions, bench


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,transformer_encoder")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--precisions", default="fp32", help="fp32[,bf16,fp16]: the tuned build also at these precisions")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    rows = []
    for name in a.models.split(","):
        build, shape = zoo.MODELS[name]
        onnx_path = tmp / f"{name}.onnx"
        onnx.save(build(), onnx_path)
        shipped = CompileOptions.make(input_shapes=[shape]).tuning_db  # this target's shipped records, if any
        builds = [("untuned", "none", "fp32")] * ("fp32" in a.precisions.split(","))
        builds += [("tuned", shipped, p) for p in a.precisions.split(",")]
        for label, db, precision in builds:
            if db is None:
                continue
            art = tmp / f"{name}-{label}-{precision}.kiln"
            t = time.perf_counter()
            r = kiln.compile(onnx_path, art, input_shapes=[shape], tuning_db=db, precision=precision)
            compile_s = time.perf_counter() - t
            for threads in (int(x) for x in a.threads.split(",")):
                b = bench(art, BenchOptions(threads=threads, warmup=5, seconds=a.seconds, onnx=str(onnx_path)))
                row = {
                    "model": name,
                    "schedules": label,
                    "precision": precision,
                    "tuned_coverage": r.report.get("tuned_coverage", 0.0),
                    "threads": threads,
                    "compile_s": round(compile_s, 1),
                    "layout": r.report["layout"],
                    "winograd_convs": r.report.get("winograd_convs", 0),
                    **{k: (v if k == "max_abs_diff" else round(v, 3)) for k, v in b.items() if isinstance(v, float)},
                    "runs": b["runs"],
                    "ratio_block_pairs": b.get("ratio_block_pairs", 0),
                }
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    lines = [
        f"Kiln {kiln.__version__} (layout NCHWc; untuned: default schedules; tuned: the records in tuning_logs/) "
        f"vs onnxruntime, batch 1, same input, alternating, medians; `-mcpu={kiln.target.Target.parse(None).mcpu}`. "
        f"Block pairs: Kiln's median over onnxruntime's for each two adjacent blocks of runs, the middle half of those "
        f"ratios (how far to trust kiln/ort).",
        "",
    ]
    precisions = len({r["precision"] for r in rows}) > 1
    lines += table(
        ["model", "schedules"]
        + ["precision"] * precisions
        + [
            "threads",
            "kiln p50 ms",
            "kiln p99 ms",
            "ort p50 ms",
            "ort p99 ms",
            "kiln/ort p50",
            "block pairs",
            "max abs diff",
        ],
        [
            [r["model"], r["schedules"]]
            + [r["precision"]] * precisions
            + [
                r["threads"],
                f"{r['p50_ms']:.2f}",
                f"{r['p99_ms']:.2f}",
                f"{r['ort_p50_ms']:.2f}",
                f"{r['ort_p99_ms']:.2f}",
                f"{r['ratio_p50']:.2f}x",
                f"{r['ratio_block_q25']:.2f}-{r['ratio_block_q75']:.2f}x ({r['ratio_block_pairs']})"
                if r.get("ratio_block_pairs")
                else "-",
                f"{r['max_abs_diff']:.1e}",
            ]
            for r in rows
        ],
    )
    save(a.out, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
