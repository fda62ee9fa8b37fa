"""Real-size transformers: Kiln against onnxruntime and OpenVINO on the same ONNX files, one process.

The models come from benchmarks/corpus/export_transformers.py (published `transformers` architectures at
their real sizes, random weights, both torch exporters, and onnxruntime's quantize_dynamic output), which
this script runs in the exporters' venv (.venv-corpus) when a file is missing. Every engine runs the same
file and input, 2 threads, batch 1, alternating in timed blocks after a warm-up (quantize.timed):

- Kiln: fp32; `--precision bf16`; `--quantize int8` calibrated on seeded inputs of the model's kind; and
  onnxruntime's quantize_dynamic file compiled by Kiln;
- onnxruntime: fp32 (the reference of every ratio and cosine) and its dynamic int8 file;
- OpenVINO (a benchmark dependency, never Kiln's): f32 (INFERENCE_PRECISION_HINT f32) and its default
  precision for this CPU (bf16 where it has AVX512-BF16 or AMX), LATENCY hint, 2 threads.

Writes benchmarks/transformers.{md,json}: per model and engine the p50, the ratio to onnxruntime fp32 and
the cosine of the output to onnxruntime fp32's, with the CPU and the command.

    .venv/bin/python benchmarks/transformers.py [--only vit_b16_224,...] [--engines kiln_fp32,ort_fp32,...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from quantize import ort_session, timed

import kiln
from kiln.runtime.hostinfo import cpu_model_name

ROOT = Path(__file__).resolve().parents[1]
REV = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
THREADS = 2
CALIB_SAMPLES = 8
BUILT_BY: dict = {}  # Kiln engine -> the git revision that compiled its artifact (this run's, or --cache's)
ENGINES = ("kiln_fp32", "kiln_bf16", "kiln_int8", "kiln_qdyn", "ort_fp32", "ort_qdyn", "ov_f32", "ov_default")


def export(models: Path, only: list[str]) -> dict:
    """The exported models' manifest, exporting what is missing in the exporters' venv."""
    venv = ROOT / ".venv-corpus" / "bin" / "python"
    script = ROOT / "benchmarks" / "corpus" / "export_transformers.py"
    if venv.exists():
        cmd = [str(venv), str(script), "--out", str(models)] + (["--only", ",".join(only)] if only else [])
        subprocess.run(cmd, check=True)
    else:
        print(f"{venv} missing (make .venv-corpus/.installed): using the files already in {models}", file=sys.stderr)
    return json.loads((models / "manifest.json").read_text())


def calibration(feed: dict, path: Path) -> Path:
    """CALIB_SAMPLES seeded inputs of the feed's kind: token ids redrawn below the feed's largest id plus one,
    masks kept, floats redrawn from the same normal distribution."""
    rng = np.random.default_rng(1)
    out = {}
    for name, x in feed.items():
        shape = (CALIB_SAMPLES, *x.shape[1:])
        if name == "input_ids":
            out[name] = rng.integers(0, int(x.max()) + 1, shape).astype(x.dtype)
        elif x.dtype.kind == "f":
            out[name] = rng.standard_normal(shape).astype(x.dtype)
        else:
            out[name] = np.repeat(x[:1], CALIB_SAMPLES, axis=0)
    np.savez(path, **out)
    return path


def kiln_engine(src: Path, feed: dict, tmp: Path, name: str, **options):
    """Compile (or, with --cache, reuse the artifact an earlier run compiled: the row names the revision that
    built it) and load."""
    art = tmp / f"{src.stem}.{name}.kiln"
    stamp = art.with_suffix(".rev")
    t = time.perf_counter()
    if not (art.exists() and stamp.exists()):
        shapes = [f"{k}:{'x'.join(map(str, v.shape))}" for k, v in feed.items()]
        kiln.compile(src, art, input_shapes=shapes, **options)
        stamp.write_text(REV)
    model = kiln.load(art, num_threads=THREADS)
    BUILT_BY[name] = stamp.read_text()
    return (lambda: model.run(feed)), time.perf_counter() - t


def ort_engine(src: Path, feed: dict):
    sess = ort_session(src, THREADS)
    return lambda: dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


def ov_engine(src: Path, feed: dict, precision: str | None):
    import openvino as ov

    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": THREADS}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = ov.Core().compile_model(str(src), "CPU", config)
    request = compiled.create_infer_request()
    names = [o.get_any_name() for o in compiled.outputs]

    def run():
        request.infer(feed)
        return {n: request.get_output_tensor(i).data.copy() for i, n in enumerate(names)}

    return run


def first(out) -> np.ndarray:
    return np.asarray(next(iter(out.values())), dtype=np.float64).ravel()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def build_engines(name: str, models: Path, manifest: dict, engines: set, tmp: Path) -> tuple[dict, dict]:
    """{engine: run function} for one model, and {engine: error or compile seconds}."""
    src, qdyn = models / f"{name}.onnx", models / f"{name}_qdynamic.onnx"
    feed = dict(np.load(models / f"{name}.inputs.npz"))
    has_qdyn = f"{name}_qdynamic" in manifest and "error" not in manifest[f"{name}_qdynamic"]
    makers = {
        "ort_fp32": lambda: ort_engine(src, feed),
        "kiln_fp32": lambda: kiln_engine(src, feed, tmp, "fp32"),
        "kiln_bf16": lambda: kiln_engine(src, feed, tmp, "bf16", precision="bf16"),
        "kiln_int8": lambda: kiln_engine(
            src, feed, tmp, "int8", quantize="int8", calibration=str(calibration(feed, tmp / "calib.npz"))
        ),
        "kiln_qdyn": (lambda: kiln_engine(qdyn, feed, tmp, "qdyn")) if has_qdyn else None,
        "ort_qdyn": (lambda: ort_engine(qdyn, feed)) if has_qdyn else None,
        "ov_f32": lambda: ov_engine(src, feed, "f32"),
        "ov_default": lambda: ov_engine(src, feed, None),
    }
    runs, notes = {}, {}
    for engine in ENGINES:
        if engine not in engines or makers[engine] is None:
            continue
        try:
            made = makers[engine]()
            runs[engine], notes[engine] = made if isinstance(made, tuple) else (made, None)
        except Exception as e:  # one engine failing to compile is a row entry, not the end of the run
            notes[engine] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            traceback.print_exc()
    return runs, notes


def measure(name: str, models: Path, manifest: dict, engines: set, seconds: float, cache: str | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(cache or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        runs, notes = build_engines(name, models, manifest, engines, folder)
        if "ort_fp32" not in runs:
            return {"error": notes.get("ort_fp32", "onnxruntime fp32 did not run")}
        outputs = {k: first(f()) for k, f in runs.items()}
        if seconds <= 0:  # --seconds 0: compile (into --cache) and check, time nothing
            return {}
        times = timed(runs, seconds)
    ref = times["ort_fp32"]["p50_ms"]
    row = {"source": manifest[name].get("source", ""), "exporter": manifest[name].get("exporter", "")}
    for engine in ENGINES:
        if engine in runs:
            p50 = times[engine]["p50_ms"]
            row[engine] = {"p50_ms": round(p50, 3), "ratio": round(p50 / ref, 3)}
            row[engine]["cosine"] = round(cosine(outputs[engine], outputs["ort_fp32"]), 5)
            if isinstance(notes.get(engine), float):
                row[engine]["compile_s"] = round(notes[engine], 1)
            if engine.startswith("kiln_"):
                row[engine]["built_by"] = BUILT_BY.get(engine.removeprefix("kiln_"), REV)
        elif isinstance(notes.get(engine), str):
            row[engine] = {"error": notes[engine]}
    return row


def cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if "error" in r:
        return f"error: {r['error'][:60]}"
    return f"{r['p50_ms']:.1f} ({r['ratio']:.2f}x, cos {r['cosine']:.4f})"


def table(rows: dict, meta: dict) -> list[str]:
    lines = [
        "# Real-size transformers: Kiln, onnxruntime and OpenVINO",
        "",
        f"CPU: {meta['cpu']}; {THREADS} threads, batch 1, untuned (no tuning records for these models); "
        f"{meta['started']}, Kiln {meta['kiln']}, onnxruntime {meta['ort']}, OpenVINO {meta['openvino']}.",
        f"Command: `{meta['command']}`. Each cell: p50 ms (ratio to onnxruntime fp32 in the same run, cosine of the "
        "output to onnxruntime fp32's). Engines alternate in timed blocks after a warm-up, in one process.",
        "",
        "| model | " + " | ".join(ENGINES) + " |",
        "|---" * (len(ENGINES) + 1) + "|",
    ]
    for name, r in rows.items():
        cells = (
            [f"error: {r['error']}"] + [""] * (len(ENGINES) - 1) if "error" in r else [cell(r.get(e)) for e in ENGINES]
        )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    built = sorted(
        {v["built_by"] for r in rows.values() for v in r.values() if isinstance(v, dict) and "built_by" in v}
    )
    lines += (
        ["", f"Kiln's artifacts were compiled by revision(s) {', '.join(built)} (the row's `built_by`)."]
        if built
        else []
    )
    ratios = [r["kiln_fp32"]["ratio"] for r in rows.values() if "ratio" in r.get("kiln_fp32", {})]
    if ratios:
        geo = float(np.exp(np.mean(np.log(ratios))))
        lines += ["", f"Kiln fp32 / onnxruntime fp32: geometric mean {geo:.2f}x over {len(ratios)} models."]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=str(ROOT / "build" / "transformers"))
    ap.add_argument("--only", default="", help="comma-separated model names (default: every exported model)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--seconds", type=float, default=10.0, help="timed seconds per model (all engines together)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "transformers"))
    ap.add_argument(
        "--cache",
        default=None,
        help="keep Kiln's artifacts here and reuse those this git revision built (compile on a busy machine, "
        "time on a quiet one); --seconds 0 only compiles",
    )
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    models = Path(args.models)
    manifest = export(models, only)
    names = [n for n in manifest if not n.endswith("_qdynamic") and (not only or n in only)]
    import onnxruntime
    import openvino

    meta = {
        "cpu": f"{cpu_model_name()} ({os.cpu_count()} logical CPUs)",
        "command": "python benchmarks/transformers.py" + "".join(f" {x}" for x in (argv or sys.argv[1:])),
        "started": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
        "kiln": REV,
        "ort": onnxruntime.__version__,
        "openvino": openvino.__version__.split("-")[0],
    }
    out = Path(args.out)
    previous = json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() else {}
    rows = {}
    for name in names:
        if "error" in manifest[name]:
            rows[name] = {"error": f"export: {manifest[name]['error']}"}
            continue
        rows[name] = measure(name, models, manifest, set(args.engines.split(",")), args.seconds, args.cache)
        if not rows[name]:  # compiled only
            del rows[name]
            continue
        rows[name]["started"] = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}"
        print(name, json.dumps(rows[name]), flush=True)
        merged = previous | rows  # a run of some models keeps the others' last rows
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": merged}, indent=1))
        out.with_suffix(".md").write_text("\n".join(table(merged, meta)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
