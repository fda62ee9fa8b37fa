"""Structured pruning, measured. Run by hand:  .venv/bin/python benchmarks/pruning.py [--seconds 15]
(needs a venv with torch for the PyTorch half, --torch-python, default .venv-corpus/bin/python).

1. PyTorch's prune.ln_structured (30% of each conv's output channels, zeros left in place) on a
   VGG-style CNN and torchvision's ResNet-18, exported to ONNX (benchmarks/pruning_torch.py):
   Kiln's build of the pruned file (RemoveZeroChannels) against Kiln's build of the unpruned one and
   onnxruntime on the same pruned file; outputs against onnxruntime's on the pruned file.
2. kiln prune --ratio 0.3 of the digits CNN (trained here in numpy, benchmarks/digits_cnn.py):
   test-split accuracy before, after pruning, after a 5-epoch fine-tune in PyTorch; FLOPs and p50;
   the pruned + fine-tuned model compiled int8 in the same table.
3. kiln prune --ratio 0.3 --multiple 16 of zoo ResNet-50 (random weights: agreement with the
   unpruned model on random inputs, not accuracy): FLOPs, p50 before/after, pruned + int8.
Writes benchmarks/pruning.{md,json}."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from quantize import ort_session, timed
from report import save, table

import kiln
from kiln import zoo
from kiln.prune import prune_model
from kiln.runtime.hostinfo import cpu_model_name

HERE = Path(__file__).resolve().parent


def _gflops(model: onnx.ModelProto) -> float:
    from kiln.prune.graph import ChannelGraph
    from kiln.prune.surgery import flops

    return sum(flops(ChannelGraph(model)).values()) / 1e9


def _compile(src, dst, **kw):
    t = time.perf_counter()
    r = kiln.compile(src, dst, **kw)
    return r, round(time.perf_counter() - t, 1)


def torch_pruned(tmp: Path, torch_python: str, seconds: float) -> list[dict]:
    subprocess.run([torch_python, str(HERE / "pruning_torch.py"), "export-ln", str(tmp)], check=True)
    rows = []
    for name, size in (("vgg", 160), ("resnet18", 224)):
        x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)
        full, ln = tmp / f"{name}.onnx", tmp / f"{name}_ln30.onnx"
        r_full, s_full = _compile(full, tmp / f"{name}.kiln")
        r_ln, s_ln = _compile(ln, tmp / f"{name}_ln30.kiln")
        k_full, k_ln = (kiln.load(tmp / f"{n}.kiln", num_threads=2) for n in (name, f"{name}_ln30"))
        o_full, o_ln = ort_session(full), ort_session(ln)
        ref = o_ln.run(None, {"input": x})[0]
        ours = k_ln.run({"input": x})["output"]
        feed = {"input": x}
        engines = {"kiln_unpruned": k_full, "kiln_pruned": k_ln}
        run = {k: (lambda m=m, f=feed: m.run(f)) for k, m in engines.items()}
        run |= {k: (lambda s=s, f=feed: s.run(None, f)) for k, s in (("ort_pruned", o_ln), ("ort_unpruned", o_full))}
        lat = timed(run, seconds)
        rows.append(
            {
                "model": name,
                "input": [1, 3, size, size],
                "gflops": round(_gflops(onnx.load(full)), 3),
                "gflops_removed_by_kiln": round(r_ln.report["zero_channel_flops_removed"] / 1e9, 3),
                "channels_removed": r_ln.report["zero_channels_removed"],
                "passes_skipped": r_ln.report["passes_skipped"],
                "compile_s": {"unpruned": s_full, "pruned": s_ln},
                "max_abs_diff_vs_ort_pruned": float(np.abs(ours - ref).max()),
                "output_abs_max": float(np.abs(ref).max()),
                "latency": lat,
            }
        )
    return rows


def digits(tmp: Path, torch_python: str, seconds: float) -> dict:
    sys.path.insert(0, str(HERE))
    from digits_cnn import DigitsCNN, load_digits_split

    (xt, yt), (xs, ys) = load_digits_split()
    net = DigitsCNN().train(xt, yt)
    src = tmp / "digits.onnx"
    onnx.save(net.to_onnx(), src)
    np.savez(tmp / "digits_calib.npz", input=xt[:128])
    np.savez(tmp / "digits_train.npz", x=xt, y=yt)
    variants = {"unpruned": src}
    prunes = {}
    for tag, multiple in (("pruned", 8), ("pruned_m1", 1)):
        model, rep = prune_model(src, 0.3, calibration=tmp / "digits_calib.npz", multiple=multiple)
        onnx.save(model, tmp / f"digits_{tag}.onnx")
        variants[tag] = tmp / f"digits_{tag}.onnx"
        ft = tmp / f"digits_{tag}_ft.onnx"
        script = str(HERE / "pruning_torch.py")
        subprocess.run(
            [torch_python, script, "finetune", str(variants[tag]), str(ft), str(tmp / "digits_train.npz")], check=True
        )
        variants[f"{tag}_finetuned"] = ft
        prunes[tag] = {
            "multiple": multiple,
            "layers": rep["layers"],
            "agreement_with_unpruned": rep["accuracy"]["outputs"]["logits"].get("top1_agreement"),
        }
    loaded, rows = {}, {}
    for tag, path in variants.items():
        _compile(path, tmp / f"d_{tag}.kiln")
        loaded[tag] = kiln.load(tmp / f"d_{tag}.kiln", num_threads=2)
    r8, _ = _compile(
        variants["pruned_finetuned"],
        tmp / "d_pruned_finetuned_int8.kiln",
        quantize="int8",
        calibration=tmp / "digits_calib.npz",
        calib_samples=112,
    )
    loaded["pruned_finetuned_int8"] = kiln.load(tmp / "d_pruned_finetuned_int8.kiln", num_threads=2)
    for tag, m in loaded.items():
        logits = np.concatenate([m.run({"input": xs[i : i + 1]})["logits"] for i in range(len(xs))])
        path = variants.get(tag.removesuffix("_int8"))
        rows[tag] = {
            "test_accuracy": float((logits.argmax(1) == ys).mean()),
            "mflops": round(_gflops(onnx.load(path)) * 1e3, 3),
        }
    x = xs[:1]
    lat = timed({k: (lambda m=m: m.run({"input": x})) for k, m in loaded.items()}, seconds)
    for k in rows:
        rows[k]["p50_ms"] = lat[k]["p50_ms"]
    q = r8.report["quantization"]
    return {
        "test_samples": len(xs),
        "numpy_fp32_accuracy": float((net.logits(xs).argmax(1) == ys).mean()),
        "rows": rows,
        "prunes": prunes,
        "int8_layers": q["int8_layers"],
        "float_layers": q["float_layers"],
    }


def resnet50(tmp: Path, seconds: float) -> dict:
    src = tmp / "resnet50.onnx"
    m = zoo.resnet50()
    onnx.save(m, src)
    rng = np.random.default_rng(0)
    np.savez(tmp / "r50_calib.npz", input=rng.standard_normal((16, 3, 224, 224)).astype(np.float32))
    t = time.perf_counter()
    pruned, rep = prune_model(src, 0.3, calibration=tmp / "r50_calib.npz", multiple=16)
    prune_s = round(time.perf_counter() - t, 1)
    onnx.save(pruned, tmp / "resnet50_p30.onnx")
    _, s_full = _compile(src, tmp / "r50.kiln")
    _, s_p = _compile(tmp / "resnet50_p30.onnx", tmp / "r50_p30.kiln")
    _, s_8 = _compile(
        tmp / "resnet50_p30.onnx",
        tmp / "r50_p30_int8.kiln",
        quantize="int8",
        calibration=tmp / "r50_calib.npz",
        calib_samples=12,
    )
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    ks = {
        k: kiln.load(tmp / f"{f}.kiln", num_threads=2)
        for k, f in (("kiln_unpruned", "r50"), ("kiln_pruned", "r50_p30"), ("kiln_pruned_int8", "r50_p30_int8"))
    }
    engines = {k: (lambda m=m: m.run({"input": x})) for k, m in ks.items()}
    o_full, o_p = ort_session(src), ort_session(tmp / "resnet50_p30.onnx")
    engines |= {
        "ort_unpruned": lambda: o_full.run(None, {"input": x}),
        "ort_pruned": lambda: o_p.run(None, {"input": x}),
    }
    return {
        "prune_s": prune_s,
        "compile_s": {"unpruned": s_full, "pruned": s_p, "pruned_int8": s_8},
        "gflops": [rep["flops_before"] / 1e9, rep["flops_after"] / 1e9],
        "parameters": [rep["parameters_before"], rep["parameters_after"]],
        "agreement": rep["accuracy"]["outputs"]["output"],
        "worst_layers": rep["accuracy"]["worst_layers"],
        "latency": timed(engines, seconds),
    }


def _lat_rows(lat: dict, base: str) -> list[list]:
    b = lat[base]["p50_ms"]
    return [
        [k, f"{v['p50_ms']:.2f}", f"{v['p90_ms']:.2f}", v["runs"], f"{b / v['p50_ms']:.2f}x"] for k, v in lat.items()
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--torch-python", default=str(HERE.parent / ".venv-corpus" / "bin" / "python"))
    ap.add_argument("--out", default=str(HERE / "pruning"))
    ap.add_argument("--skip-resnet50", action="store_true")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kiln-prune-"))
    load0 = os.getloadavg()[0]
    tp = torch_pruned(tmp, a.torch_python, a.seconds)
    d = digits(tmp, a.torch_python, a.seconds)
    r = None if a.skip_resnet50 else resnet50(tmp, a.seconds)
    load1 = os.getloadavg()[0]
    lines = [
        f"# Structured pruning on {cpu_model_name()} (`-mcpu={kiln.target.Target.parse(None).mcpu}`), "
        "2 threads, batch 1",
        "",
        f"Kiln {kiln.__version__}, untuned default schedules. One run of `benchmarks/pruning.py`. The machine is",
        f"shared (load average {load0:.1f} on 2 cores at the start, {load1:.1f} at the end): engines alternate in",
        "blocks, medians; read ratios, not absolute times. Speed-up columns: the first row's p50 over this row's.",
        "",
        "## PyTorch ln_structured (30% of each conv's output channels zeroed, shapes kept), exported to ONNX",
        "",
    ]
    for t in tp:
        lines += [
            f"### {t['model']} {'x'.join(map(str, t['input']))}: {t['gflops']} GFLOPs; RemoveZeroChannels removed "
            f"{t['channels_removed']} channels, {t['gflops_removed_by_kiln']} GFLOPs; Kiln vs onnxruntime on the "
            f"pruned file: max abs diff {t['max_abs_diff_vs_ort_pruned']:.2g} "
            f"(outputs up to {t['output_abs_max']:.3g})",
            "",
        ]
        lines += table(["engine", "p50 ms", "p90 ms", "runs", "speed-up"], _lat_rows(t["latency"], "kiln_unpruned"))
        lat = t["latency"]
        lines += [
            "",
            f"Kiln pruned: {lat['kiln_unpruned']['p50_ms'] / lat['kiln_pruned']['p50_ms']:.2f}x Kiln unpruned, "
            f"{lat['ort_pruned']['p50_ms'] / lat['kiln_pruned']['p50_ms']:.2f}x onnxruntime on the pruned file. "
            f"Compile s: {t['compile_s']}.",
            "",
        ]
    lines += [
        "ResNet-18 gains less: PyTorch zeroes different channels in the two branches of each residual add (and in",
        "the stem), so no channel of the residual stream is a constant and only each block's inner conv pair shrinks;",
        "`kiln prune` ties the branches instead (ResNet-50 below). Kiln pruned vs unpruned p50 is the must-show ratio.",
        "",
    ]
    rows = d["rows"]
    lines += [
        f"## kiln prune --ratio 0.3 of the digits CNN ({d['test_samples']} test images; numpy fp32 accuracy "
        f"{d['numpy_fp32_accuracy'] * 100:.2f}%)",
        "",
    ]
    lines += table(
        ["model", "MFLOPs", "test accuracy", "p50 ms (Kiln)"],
        [[k, v["mflops"], f"{v['test_accuracy'] * 100:.2f}%", f"{v['p50_ms']:.3f}"] for k, v in rows.items()],
    )
    for tag, p in d["prunes"].items():
        ch = ", ".join(f"{l['layer']} {l['channels'][0]}->{l['channels'][1]}" for l in p["layers"])
        lines += ["", f"{tag} (--multiple {p['multiple']}): {ch}; top-1 agreement with the unpruned model on the"
                  f" calibration images {p['agreement_with_unpruned']:.4f}"]  # fmt: skip
    lines += [
        "",
        "Fine-tune: 5 epochs of Adam (lr 1e-3) in PyTorch on the training split, benchmarks/pruning_torch.py.",
        f"int8 (pruned + fine-tuned): int8 layers {', '.join(d['int8_layers']) or 'none'}; float: "
        + "; ".join(f"{k} ({v})" for k, v in d["float_layers"].items()),
        "",
    ]
    if r is not None:
        lines += [
            f"## kiln prune --ratio 0.3 --multiple 16 of zoo ResNet-50: {r['gflops'][0]:.2f} -> {r['gflops'][1]:.2f} "
            f"GFLOPs, {r['parameters'][0]:,} -> {r['parameters'][1]:,} parameters (prune {r['prune_s']} s)",
            "",
            "Random weights: no accuracy to report; agreement with the unpruned model on 16 random inputs: "
            f"top-1 {r['agreement'].get('top1_agreement', float('nan')):.3f}, cosine {r['agreement']['cosine']:.4f}"
            " (a fine-tune would start from there).",
            "",
        ]
        lines += table(["engine", "p50 ms", "p90 ms", "runs", "speed-up"], _lat_rows(r["latency"], "kiln_unpruned"))
        lines += ["", f"Compile s: {r['compile_s']}.", ""]
    save(
        a.out, {"cpu": cpu_model_name(), "load_average": [load0, load1], "torch": tp, "digits": d, "resnet50": r}, lines
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
