"""Exports each architecture of benchmarks/frontends.md twice from ONE model instance: torch.export
(NAME.pt2, torch.export.save) and torch.onnx.export (NAME.onnx, TorchScript exporter, opset 17), plus the
seeded input and eager PyTorch's outputs (NAME.npz), so run.py can compare both import paths with eager.
Runs in the exporters' venv (.venv-corpus: torch, torchvision, transformers); reuses the corpus builders.

    .venv-corpus/bin/python benchmarks/frontends/export.py [--out build/frontends] [--only a,b]
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "corpus"))
import export as corpus  # noqa: E402

MODELS = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "squeezenet1_1", "shufflenet_v2_x0_5", "mnasnet0_5",
          "efficientnet_b0", "regnet_y_400mf", "bert", "distilbert", "gpt2", "vit"]  # fmt: skip


def export_one(name: str, out: Path) -> dict:
    import torch

    build, inputs, _, source, *_ = corpus.TORCH[name]
    torch.manual_seed(corpus.SEED)
    model = build()
    rng = np.random.default_rng(corpus.SEED)
    feeds = {k: corpus.make_input(rng, *spec) for k, spec in inputs.items()}
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    with torch.no_grad():
        ref = model(*args)
    ref = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
    rec = {"name": name, "source": source, "torch": torch.__version__, "inputs": list(feeds)}
    try:
        torch.export.save(torch.export.export(model, args), out / f"{name}.pt2")
    except Exception as e:
        rec["pt2_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    try:
        torch.onnx.export(model, args, out / f"{name}.onnx", input_names=list(feeds), opset_version=17, dynamo=False)
    except Exception as e:
        rec["onnx_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    np.savez(
        out / f"{name}.npz", **{f"in_{k}": v for k, v in feeds.items()}, **{f"out_{i}": r for i, r in enumerate(ref)}
    )
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "build" / "frontends"))
    ap.add_argument("--only", default="")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for name in [m for m in MODELS if not a.only or m in a.only.split(",")]:
        try:
            records.append(export_one(name, out))
        except Exception:
            records.append({"name": name, "error": traceback.format_exc().splitlines()[-1][:300]})
        print(json.dumps(records[-1]), flush=True)
    (out / "manifest.json").write_text(json.dumps(records, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
