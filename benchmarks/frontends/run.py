"""Compiles each exported architecture (export.py) twice with Kiln, from its torch.export program
(.pt2) and from its ONNX export, checks both against eager PyTorch's outputs, and times p50 of each
beside onnxruntime on the ONNX file. Writes benchmarks/frontends.json; the table in
benchmarks/frontends.md is made from it (--md prints it).

    .venv/bin/python benchmarks/frontends/run.py [--dir build/frontends] [--only a,b] [--runs 30] [--md]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from timing import p50s  # this folder is on sys.path: the scripts run as files

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "frontends.json"


def _err(outs, refs) -> float:
    return max(
        float(np.max(np.abs(np.asarray(o, np.float64) - r)) / (1.0 + float(np.max(np.abs(r)))))
        for o, r in zip(outs, refs)
    )


def kiln_path(path: Path, feeds: dict, refs: list, tmp: Path, timers: dict) -> dict:
    import kiln

    t = time.perf_counter()
    try:
        r = kiln.compile(path, tmp / f"{path.name}.kiln")
    except Exception as e:
        return {"status": "error", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    m = kiln.load(r.path)
    named = dict(zip([s.name for s in m.inputs], feeds.values()))
    outs = list(m.run(named).values())
    err = _err(outs, refs)
    timers[path.suffix[1:]] = lambda: m.run(named)
    return {
        "status": "pass" if err < 1e-3 else "mismatch",
        "rel_err": float(f"{err:.2e}"),
        "compile_s": round(time.perf_counter() - t, 1),
        "frontend": r.manifest["source"]["frontend"],
    }


def ort_path(path: Path, feeds: dict, refs: list, timers: dict) -> dict:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    named = dict(zip([i.name for i in s.get_inputs()], feeds.values()))
    outs = s.run(None, named)
    timers["onnxruntime"] = lambda: s.run(None, named)
    return {"rel_err": float(f"{_err(outs, refs):.2e}")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=str(ROOT / "build" / "frontends"))
    ap.add_argument("--only", default="")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--md", action="store_true", help="print the markdown table of benchmarks/frontends.json")
    a = ap.parse_args(argv)
    if a.md:
        print(table(json.loads(OUT.read_text())))
        return 0
    d = Path(a.dir)
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    for rec in json.loads((d / "manifest.json").read_text()):
        name = rec["name"]
        if a.only and name not in a.only.split(","):
            continue
        z = np.load(d / f"{name}.npz")
        feeds = {k[3:]: z[k] for k in z.files if k.startswith("in_")}
        refs = [z[f"out_{i}"].astype(np.float64) for i in range(sum(k.startswith("out_") for k in z.files))]
        row = {"source": rec.get("source"), "exported_by": rec.get("torch")}
        row["eager_max"] = float(f"{max(float(np.max(np.abs(r))) for r in refs):.3g}")  # near 0: rel err says little
        timers: dict = {}
        with tempfile.TemporaryDirectory() as tmp:
            for kind in ("pt2", "onnx"):
                f = d / f"{name}.{kind}"
                try:
                    row[kind] = kiln_path(f, feeds, refs, Path(tmp), timers) if f.exists() else {
                        "status": "export failed", "error": rec.get(f"{kind}_error")}  # fmt: skip
                except Exception:
                    row[kind] = {"status": "error", "error": traceback.format_exc().splitlines()[-1][:300]}
            if (d / f"{name}.onnx").exists():
                row["onnxruntime"] = ort_path(d / f"{name}.onnx", feeds, refs, timers)
            for k, ms in p50s(timers, a.runs).items():
                row[k]["p50_ms"] = ms
        results[name] = row
        print(json.dumps({name: row}), flush=True)
        OUT.write_text(json.dumps(results, indent=2))
    return 0


def _scaled(r: dict, kind: str) -> str:
    """max |kiln - eager| / max |eager|: what rel err says where eager's outputs are near 0 (random
    weights whose activations die out), back from rel err = max |d| / (1 + max |eager|)."""
    err, top = r.get(kind, {}).get("rel_err"), r.get("eager_max")
    return f"{err * (1 + top) / top:.1e}" if err is not None and top else "-"


def _ratio(r: dict, kind: str) -> str:
    ms, ort = r.get(kind, {}).get("p50_ms"), r.get("onnxruntime", {}).get("p50_ms")
    return f"{ms / ort:.2f}" if ms and ort else "-"


def table(results: dict) -> str:
    lines = [
        "| model | source | .pt2 status | .pt2 rel err | .pt2 p50 ms | .onnx status | .onnx rel err | .onnx p50 ms "
        "| onnxruntime p50 ms | .pt2 / ort | .onnx / ort | max abs eager | .pt2 err / max | .onnx err / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        cells = [str(r.get(k, {}).get(f, "-")) for k in ("pt2", "onnx") for f in ("status", "rel_err", "p50_ms")]
        cells += [str(r.get("onnxruntime", {}).get("p50_ms", "-")), _ratio(r, "pt2"), _ratio(r, "onnx")]
        cells += [str(r.get("eager_max", "-")), _scaled(r, "pt2"), _scaled(r, "onnx")]
        lines.append(f"| {name} | {r.get('source')} | " + " | ".join(cells) + " |")
    errors = [
        f"- {n} {k}: {r[k]['error']}" for n, r in results.items() for k in ("pt2", "onnx") if "error" in r.get(k, {})
    ]
    return "\n".join(lines + ([""] + errors if errors else []))


if __name__ == "__main__":
    sys.exit(main())
