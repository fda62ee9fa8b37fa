"""How far a quantized model is from its float original, on held-out inputs: per output max/mean
abs error and cosine similarity, top-1 agreement for classifier outputs ([batch, classes]), and
the layers whose outputs moved most (relative L2 error of each int8 layer's output)."""

from __future__ import annotations

import numpy as np

from ...errors import AccuracyError

WORST = 5


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == 0 and nb == 0 else float(np.dot(a.ravel(), b.ravel()) / max(na * nb, 1e-30))


def is_classifier(shape) -> bool:
    return len(shape) == 2 and shape[1] > 1


def compare(output_names, float_runs, quant_runs, layer_names, float_layers, quant_layers) -> dict:
    """float_runs/quant_runs: per sample, the list of output arrays; *_layers: per sample, a dict
    layer name -> its output (float model vs int8 model)."""
    outputs = {}
    for k, name in enumerate(output_names):
        f = np.concatenate([r[k].reshape(-1) for r in float_runs]).astype(np.float64)
        q = np.concatenate([r[k].reshape(-1) for r in quant_runs]).astype(np.float64)
        d = np.abs(f - q)
        entry = {
            "max_abs_error": float(d.max()),
            "mean_abs_error": float(d.mean()),
            "cosine": _cos(f, q),
            "float_abs_max": float(np.abs(f).max()),
        }
        if is_classifier(float_runs[0][k].shape):
            fa = np.concatenate([r[k].argmax(axis=1) for r in float_runs])
            qa = np.concatenate([r[k].argmax(axis=1) for r in quant_runs])
            entry["top1_agreement"] = float((fa == qa).mean())
        outputs[name] = entry
    layers = []
    for name in layer_names:
        f = np.concatenate([s[name].reshape(-1) for s in float_layers]).astype(np.float64)
        q = np.concatenate([s[name].reshape(-1) for s in quant_layers]).astype(np.float64)
        layers.append(
            {
                "layer": name,
                "relative_error": float(np.linalg.norm(f - q) / max(np.linalg.norm(f), 1e-30)),
                "max_abs_error": float(np.abs(f - q).max()),
                "cosine": _cos(f, q),
            }
        )
    layers.sort(key=lambda e: -e["relative_error"])
    return {"samples": len(float_runs), "outputs": outputs, "worst_layers": layers[:WORST]}


def agreement(report: dict) -> float:
    """Top-1 agreement over classifier outputs; else the lowest output cosine similarity."""
    tops = [o["top1_agreement"] for o in report["outputs"].values() if "top1_agreement" in o]
    return min(tops) if tops else min(o["cosine"] for o in report["outputs"].values())


QUANT_FIX = (
    "keep those layers float with --keep-float LAYER, calibrate on more samples, or try --calib-method percentile"
)


def check_agreement(
    report: dict,
    minimum: float | None,
    where: str,
    subject: str = "quantized model",
    fix: str = QUANT_FIX,
    data: str = "held-out samples",
) -> None:
    """AccuracyError naming the worst layers when the agreement is below `minimum` (kiln prune
    passes its own subject and fix)."""
    if minimum is None:
        return
    got = agreement(report)
    if got < minimum:
        worst = ", ".join(f"{w['layer']} (rel. error {w['relative_error']:.3g})" for w in report["worst_layers"])
        raise AccuracyError(
            f"{subject} agreement {got:.4f} is below --min-agreement {minimum} on {report['samples']} {data};"
            f" layers with the largest error: {worst or 'none'}",
            where=where,
            fix=fix,
        )
