"""GEMM sweep: Kiln's float32 matmul against onnxruntime's MatMul at every kind of row count.

For each M (1 .. 2048: powers of two, primes, the token counts of real models: 77, 197, 577, 1500) and each
(K, N) of a transformer ([M, 768] x [768, 768], x [768, 3072], [M, 3072] x [3072, 768]), one ONNX model
`MatMul(x, W) + b` with constant weights, compiled by Kiln (untuned) and run beside onnxruntime in one process
(2 threads, alternating timed blocks after a warm-up: quantize.timed). Each row: both p50s, Kiln / onnxruntime,
and Kiln's GFLOP/s as a share of this CPU's measured FMA peak (kiln.runtime.peak, as `kiln profile` reports).

    .venv/bin/python benchmarks/gemm_sweep.py [--seconds 1.0] [--repeat 3] [--rows 16,17,197] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from quantize import ort_session, timed

import kiln
from kiln.runtime.hostinfo import cpu_model_name
from kiln.runtime.peak import fresh_fma_peak

ROOT = Path(__file__).resolve().parents[1]
ROWS = (1, 2, 4, 8, 16, 17, 31, 32, 50, 64, 77, 100, 128, 197, 256, 257, 384, 511, 512, 577, 1024, 1500, 2048)
SHAPES = ((768, 768), (768, 3072), (3072, 768))


def model(m: int, k: int, n: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((k, n)) * 0.05).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])]
    g = helper.make_graph(
        nodes,
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def one(m: int, k: int, n: int, seconds: float, tmp: Path, peak: float, repeat: int = 1) -> dict:
    """One row: `repeat` same-process measurements (alternating blocks each), their median ratio and its spread.
    On a shared 2-vCPU host one measurement's ratio moved by up to 2x when a neighbour was busy (benchmarks/
    history.md); the median of three was stable to a few percent."""
    src, art = tmp / "g.onnx", tmp / "g.kiln"
    onnx.save(model(m, k, n), src)
    kiln.compile(src, art)
    ours = kiln.load(art, num_threads=2)
    sess = ort_session(src, 2)
    x = {"x": np.random.default_rng(1).standard_normal((1, m, k)).astype(np.float32)}
    diff = float(np.abs(ours.run(x)["y"] - sess.run(None, x)[0]).max())
    runs = [timed({"kiln": lambda: ours.run(x), "ort": lambda: sess.run(None, x)}, seconds) for _ in range(repeat)]
    ratios = sorted(t["kiln"]["p50_ms"] / t["ort"]["p50_ms"] for t in runs)
    kp = float(np.median([t["kiln"]["p50_ms"] for t in runs]))
    op = float(np.median([t["ort"]["p50_ms"] for t in runs]))
    gflops = 2 * m * k * n / kp / 1e6
    return {
        "M": m,
        "K": k,
        "N": n,
        "kiln_ms": round(kp, 4),
        "ort_ms": round(op, 4),
        "ratio": round(float(np.median(ratios)), 3),
        "ratio_range": [round(ratios[0], 3), round(ratios[-1], 3)],
        "gflops": round(gflops, 1),
        "peak_share": round(gflops / peak, 3),
        "max_abs_diff": diff,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--repeat", type=int, default=3, help="measurements per row: the median ratio is reported")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "gemm_sweep"))
    args = ap.parse_args(argv)
    peak = fresh_fma_peak(2)["gflops"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, n in SHAPES:
            for m in (int(r) for r in args.rows.split(",")):
                rows.append(one(m, k, n, args.seconds, Path(tmp), peak, args.repeat))
                print(json.dumps(rows[-1]), flush=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    meta = {
        "cpu": f"{cpu_model_name()} ({os.cpu_count()} logical CPUs)",
        "started": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
        "kiln": rev.strip(),
        "peak_gflops": round(peak, 1),
        "command": "python benchmarks/gemm_sweep.py " + " ".join(argv or []),
    }
    lines = [
        "# GEMM sweep: Kiln's float32 matmul + bias against onnxruntime's MatMul + Add",
        "",
        f"CPU: {meta['cpu']}, 2 threads, untuned; measured FMA peak {meta['peak_gflops']} GFLOP/s; "
        f"{meta['started']}, Kiln {meta['kiln']}. Command: `{meta['command'].strip()}`. Each row: {args.repeat} "
        "measurements in one process (alternating timed blocks each); the times are their medians, the ratio the "
        "median of their ratios, with the lowest and highest beside it.",
        "",
        "| M | K x N | Kiln ms | onnxruntime ms | Kiln / onnxruntime | (range) | Kiln GFLOP/s | % of peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['M']} | {r['K']} x {r['N']} | {r['kiln_ms']:.3f} | {r['ort_ms']:.3f} | {r['ratio']:.2f}x | "
        f"{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f} | "
        f"{r['gflops']:.0f} | {100 * r['peak_share']:.0f}% |"
        for r in rows
    ]
    worst = max((r for r in rows if 16 <= r["M"] <= 2048), key=lambda r: r["ratio"])
    lines += ["", f"Worst M in 16..2048: {worst['M']} ({worst['K']} x {worst['N']}) at {worst['ratio']:.2f}x."]
    out = Path(args.out)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
