"""int8 against float32 per instruction set, measured on this host in one run. Run by hand:

  .venv/bin/python benchmarks/isa.py [--targets host,"llvm -mcpu=alderlake","llvm -mcpu=haswell"]
                                      [--models resnet50] [--seconds 60]

For every target this host can run (its own CPU, an AVX-VNNI build, the AVX2 build: x86 code for an
older ISA runs on a newer CPU), zoo ResNet-50 (random weights; calibration on random-normal inputs)
compiled by Kiln in float32 and --quantize int8 (untuned default schedules), against onnxruntime
float32 and onnxruntime's own int8 (quantize_static QDQ, per-channel, the same 16 calibration
inputs), all timed in the same process, engines alternating in blocks (benchmarks/quantize.timed).
Writes benchmarks/isa.{md,json}."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from quantize import ort_int8, ort_session, timed
from report import save, table

import kiln
from kiln import zoo
from kiln.compiler.hostrun import missing_on_host
from kiln.runtime.hostinfo import cpu_model_name
from kiln.target import Target

DEFAULT_TARGETS = ("host", "llvm -mcpu=alderlake", "llvm -mcpu=haswell")


def _cosine(a, b) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def build(name: str, tmp: Path, targets: list[str], tuning_db: str | None) -> tuple[dict, dict, np.ndarray]:
    """Artifacts per target (fp32, int8) and the onnxruntime sessions; returns (engines, info, x)."""
    make, shape = zoo.MODELS[name]
    src = tmp / f"{name}.onnx"
    onnx.save(make(), src)
    dims = [int(d) for d in shape.split(":")[1].split("x")]
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((16, *dims[1:])).astype(np.float32)
    np.savez(tmp / "calib.npz", input=calib)
    x = rng.standard_normal(dims).astype(np.float32)
    sessions = {
        "onnxruntime fp32": ort_session(src),
        "onnxruntime int8": ort_session(ort_int8(src, tmp / "ort8.onnx", [{"input": c[None]} for c in calib])),
    }
    ref = sessions["onnxruntime fp32"].run(None, {"input": x})[0]
    engines = {k: (lambda s=s: s.run(None, {"input": x})) for k, s in sessions.items()}
    info = {k: {"cosine_vs_ort_fp32": _cosine(s.run(None, {"input": x})[0], ref)} for k, s in sessions.items()}
    for spec in targets:
        t = Target.parse(None if spec == "host" else spec)
        for mode in ("fp32", "int8"):
            kw = {"quantize": "int8", "calibration": tmp / "calib.npz", "calib_samples": 12} if mode == "int8" else {}
            path = tmp / f"{t.mcpu}_{mode}.kiln"
            t0 = time.perf_counter()
            r = kiln.compile(src, path, input_shapes=[shape], target=str(t), tuning_db=tuning_db, **kw)
            m = kiln.load(path, num_threads=2)
            key = f"kiln {t.mcpu} {mode}"
            engines[key] = lambda m=m: m.run({"input": x})
            q = r.report.get("quantization", {})
            info[key] = {
                "target": str(t),
                "int8_path": t.caps.int8_path,
                "compile_s": round(time.perf_counter() - t0, 1),
                "cosine_vs_ort_fp32": _cosine(m.run({"input": x})["output"], ref),
                "int8_layers": len(q.get("int8_layers", [])),
                "float_layers": q.get("float_layers", {}),
                "speed": q.get("speed"),
            }
    return engines, info, x


# issue 21's bars, which assume onnxruntime on the same ISA; here it runs this host's best kernels for every row
BARS = (
    "int8 at most 0.5x onnxruntime fp32 with an int8 dot instruction, 0.7x on AVX2; below onnxruntime int8. "
    "onnxruntime uses this host's ISA in every row, so the AVX2 and AVX-VNNI rows face a stronger baseline "
    "than the bars assume"
)


def render(d: dict) -> list[str]:
    """The markdown of one run's JSON (main writes both; --render re-makes the markdown alone)."""
    lines = [
        f"# int8 and float32 per instruction set, on {d['cpu']} (`{d.get('host_target', '-mcpu=' + d['host_mcpu'])}`, "
        "int8 path "
        f"`{d['host_int8_path']}`)",
        "",
        f"Command: `{d['command'].strip()}`. Kiln {d['kiln_version']}, 2 threads, batch 1, "
        + ("shipped tuning records where they apply" if d["tuned"] else "untuned default schedules (--tuning-db none)")
        + ", zoo models with random weights (calibration: 16 random-normal inputs; Kiln calibrates on 12 and checks "
        "on 4, onnxruntime's quantize_static uses all 16). All engines in one process, alternating in blocks; p50 of "
        "each. "
        + (
            f"Started {d['started']} at Kiln {d['kiln_rev']}, 1-minute load average {d['load']}. "
            if "load" in d
            else "The machine was shared with other jobs, so timings are noisy. "
        )
        + "Compare ratios within one table.",
        "",
        "onnxruntime runs its own kernels for this host's CPU (AVX-512 and VNNI where the host has them); the "
        "Kiln rows for other targets run that target's code on this host (x86 code for an older ISA runs on a newer "
        "CPU). So the AVX2 (haswell) rows use no AVX-512 and no VNNI, while onnxruntime beside them does"
        + (
            " (and its int8 GEMMs may use AMX: MLAS has AMX u8s8 kernels). The host's own row uses AMX tiles for int8 "
            "convs."
            if d.get("host_int8_path") == "amx-int8"
            else "."
        ),
        "",
    ]
    if d["skipped"]:
        lines += [f"Not measured (this host cannot run their code): {', '.join(d['skipped'])}.", ""]
    for m in d["models"]:
        lat, info = m["latency"], m["info"]
        ort32, ort8 = lat["onnxruntime fp32"]["p50_ms"], lat["onnxruntime int8"]["p50_ms"]
        rows, bars = [], []
        for k, v in lat.items():
            i = info[k]
            kiln_int8 = k.startswith("kiln") and k.endswith("int8")
            own = k.rsplit(" ", 1)[0] + " fp32" if k.startswith("kiln") else None
            rows.append(
                [
                    k,
                    i.get("int8_path", "-") if kiln_int8 else "-",
                    f"{v['p50_ms']:.2f}",
                    f"{v['p50_ms'] / ort32:.2f}x",
                    f"{v['p50_ms'] / ort8:.2f}x",
                    f"{v['p50_ms'] / lat[own]['p50_ms']:.2f}x" if own and own != k else "-",
                    f"{i['cosine_vs_ort_fp32']:.4f}",
                    i.get("int8_layers", "-") if kiln_int8 else "-",
                    (i.get("speed") or {}).get("predicted_ratio", "-"),
                ]
            )
            if kiln_int8:
                bar = 0.7 if "pmaddubsw" in i["int8_path"] else 0.5
                r32, r8 = v["p50_ms"] / ort32, v["p50_ms"] / ort8
                bars.append(
                    f"- {k}: {r32:.2f}x onnxruntime fp32 (bar {bar}x: {'met' if r32 <= bar else 'not met'}), "
                    f"{r8:.2f}x onnxruntime int8 ({'faster' if r8 < 1 else 'not faster'})"
                )
        header = ["engine", "int8 kernel", "p50 ms", "vs ORT fp32", "vs ORT int8", "vs Kiln fp32 (same target)"]
        header += ["cosine vs ORT fp32", "int8 layers", "predicted int8/fp32"]
        lines += [f"## {m['model']}", "", *table(header, rows), "", f"Against the bars ({BARS}):", "", *bars, ""]
        for k, i in info.items():
            if k.startswith("kiln") and k.endswith("int8"):
                floats = "; ".join(f"{n} ({why})" for n, why in i["float_layers"].items()) or "none"
                lines += [f"Layers left float in {k}: {floats}", ""]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated; 'host' is this CPU")
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", default="benchmarks/isa")
    ap.add_argument("--tuned", action="store_true", help="use the tuning records Kiln ships (default: none, untuned)")
    ap.add_argument("--render", action="store_true", help="only re-make OUT.md from OUT.json")
    a = ap.parse_args(argv)
    if a.render:
        d = json.loads(Path(a.out).with_suffix(".json").read_text())
        save(a.out, d, render(d))
        return 0
    targets = [s.strip() for s in a.targets.split(",") if s.strip()]
    skipped = [s for s in targets if s != "host" and missing_on_host(Target.parse(s))]
    targets = [s for s in targets if s not in skipped]
    tmp = Path(tempfile.mkdtemp(prefix="kiln-isa-"))
    host = Target.parse(None)
    d = {
        "cpu": cpu_model_name(),
        "host_target": str(host),
        "host_mcpu": host.mcpu,
        "host_int8_path": host.caps.int8_path,
        "kiln_version": kiln.__version__,
        "command": "python benchmarks/isa.py " + " ".join(shlex.quote(v) for v in (argv or sys.argv[1:])),
        "tuned": a.tuned,
        "started": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
        "kiln_rev": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "load": f"{os.getloadavg()[0]:.2f}",
        "skipped": skipped,
        "models": [],
    }
    for name in a.models.split(","):
        engines, info, _ = build(name, tmp, targets, None if a.tuned else "none")
        lat = timed(engines, a.seconds)
        print(json.dumps(lat), flush=True)  # the raw timings first, whatever the table does
        d["models"].append({"model": name, "latency": lat, "info": info})
    save(a.out, d, render(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
