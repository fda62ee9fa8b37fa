"""This CPU's fp32 FMA peak: the ceiling any direct-convolution schedule (Kiln's, onnxruntime's)
works under. Compiles a loop of 12 independent AVX-512 (else AVX2) FMA chains with the system C
compiler (kiln/runtime/peak.py, which `kiln profile` runs briefly) and runs it in 1 and in N
processes at once. With --models, also what a speed goal "p50 at most R x
onnxruntime's" demands of this CPU for each zoo model: onnxruntime's p50 (N threads, warm-up, median
of runs, alternating with Kiln's float32 build as `kiln bench --onnx` does), the model's float32
FLOPs as a direct convolution (what onnxruntime computes) and as Kiln builds it (Winograd convs do
fewer), and the GFLOP/s each would need to sustain, end to end, to meet the goal, as a share of the
measured peak, beside what Kiln sustains now. Run by hand:
  .venv/bin/python benchmarks/peak.py [--procs 2] [--models resnet50,mobilenet_v2 --ratio 0.8 --out benchmarks/peak]"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from report import save, table

from kiln.runtime.peak import build_fma, run_at_once  # the FMA loop, shared with `kiln profile`


def model_gflop(name: str, disabled: tuple[str, ...] = ()) -> float:
    """The float32 FLOPs (TVM's estimate, summed over every kernel call) of zoo model `name` as
    Kiln's pipeline builds it, without the passes in `disabled`."""
    from kiln import zoo
    from kiln.compiler.analysis import kernels
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx
    from kiln.schedules.rules.apply import estimated_flops

    opts = CompileOptions.make(input_shapes=[zoo.MODELS[name][1]], disabled_passes=disabled, tuning_db=None)
    mod = optimize(import_onnx(zoo.build(name), opts.shapes).mod, opts).mod
    return sum(estimated_flops(mod[k]) for k in kernels(mod)) / 1e9


def bench_model(name: str, threads: int, seconds: float) -> dict:
    """Kiln (float32, this target's shipped tuning records) and onnxruntime on zoo model `name`,
    alternating in one process (`kiln bench --onnx`): both p50s."""
    import onnx

    import kiln
    from kiln import zoo
    from kiln.runtime.bench import BenchOptions, bench

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.onnx"
        onnx.save(zoo.build(name), path)
        kiln.compile(path, Path(tmp) / "m.kiln", input_shapes=[zoo.MODELS[name][1]])
        return bench(Path(tmp) / "m.kiln", BenchOptions(threads=threads, seconds=seconds, onnx=str(path)))


def _peak(exe: Path, procs: int, tries: int) -> tuple[float, list[float]]:
    """The best of `tries` runs: on one core, and in `procs` processes at once (per process)."""
    one = max(run_at_once(exe, 1)[0] for _ in range(tries))
    return one, max((run_at_once(exe, procs) for _ in range(tries)), key=sum)


def demands(models: list[str], peak: float, procs: int, ratio: float, seconds: float) -> list[dict]:
    rows = []
    for name in models:
        b = bench_model(name, procs, seconds)
        ort, kln, ort_min = b["ort_p50_ms"], b["p50_ms"], b["ort_min_ms"]
        direct, built = model_gflop(name, ("Winograd",)), model_gflop(name)
        goal = ratio * ort
        rows.append(
            {
                "model": name,
                "threads": procs,
                "ort_p50_ms": round(ort, 3),
                "kiln_p50_ms": round(kln, 3),
                "direct_gflop": round(direct, 3),
                "kiln_gflop": round(built, 3),
                "ort_gflops": round(direct / ort * 1e3, 1),
                "kiln_gflops": round(built / kln * 1e3, 1),
                "goal_ms": round(goal, 3),
                "goal_direct_gflops": round(direct / goal * 1e3, 1),
                "goal_kiln_gflops": round(built / goal * 1e3, 1),
                "ort_min_ms": round(ort_min, 3),
                "goal_at_min_kiln_gflops": round(built / (ratio * ort_min) * 1e3, 1),
                "peak_gflops": round(peak, 1),
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--models", default="", help="comma-separated zoo models: what --ratio x onnxruntime demands")
    ap.add_argument("--ratio", type=float, default=0.8)
    ap.add_argument(
        "--tries", type=int, default=5, help="peak: the best of this many runs (a busy neighbour only lowers it)"
    )
    ap.add_argument("--seconds", type=float, default=5.0, help="onnxruntime's timed runs per model")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        built = build_fma(tmp, n=400_000_000)
        if built is None:
            print("peak: no C compiler on PATH (install gcc), or no AVX2/AVX-512 on it or this CPU")
            return 0
        exe = built[0]
        one, each = _peak(exe, a.procs, a.tries)
        print(
            f"fp32 FMA peak: {one:.1f} GFLOP/s on one core; {sum(each):.1f} GFLOP/s on {a.procs} at once "
            f"({', '.join(f'{x:.1f}' for x in each)})"
        )
        if not a.models:
            return 0
        rows = demands([m for m in a.models.split(",") if m], sum(each), a.procs, a.ratio, a.seconds)
        one2, each2 = _peak(exe, a.procs, a.tries)  # again after the models: a neighbour only ever lowers it
        one, each = max(one, one2), max(each, each2, key=sum)
    peak = sum(each)
    for r in rows:
        r["peak_gflops"] = round(peak, 1)
    pct = lambda g: f"{g:.0f} ({g / peak:.0%})"
    lines = [
        f"What p50 <= {a.ratio}x onnxruntime's demands here: float32 GFLOP/s sustained end to end, and its share of "
        f"the {peak:.0f} GFLOP/s FMA peak measured on {a.procs} cores (`benchmarks/peak.py --models ...`). "
        "Direct: the FLOPs onnxruntime computes; Kiln: with its Winograd convs. A busy machine slows both engines "
        "and lowers what the goal seems to need; the last column asks the same of onnxruntime's fastest run.",
        "",
        *table(
            [
                "model",
                "threads",
                "ort p50 ms",
                "ort GFLOP/s (share)",
                "goal ms",
                "direct GFLOP",
                "needs (share)",
                "Kiln GFLOP",
                "needs (share)",
                "Kiln p50 ms",
                "Kiln GFLOP/s (share)",
                "ort min ms",
                "needs at its min (share)",
            ],
            [
                [
                    r["model"],
                    r["threads"],
                    r["ort_p50_ms"],
                    pct(r["ort_gflops"]),
                    r["goal_ms"],
                    r["direct_gflop"],
                    pct(r["goal_direct_gflops"]),
                    r["kiln_gflop"],
                    pct(r["goal_kiln_gflops"]),
                    r["kiln_p50_ms"],
                    pct(r["kiln_gflops"]),
                    r["ort_min_ms"],
                    pct(r["goal_at_min_kiln_gflops"]),
                ]
                for r in rows
            ],
        ),
    ]
    if a.out:
        save(
            a.out,
            {"peak_one_core_gflops": one, "peak_gflops": peak, "procs": a.procs, "ratio": a.ratio, "models": rows},
            lines,
        )
    else:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
