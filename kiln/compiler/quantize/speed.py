"""Whether int8 pays on the target: each layer's cost in float32 multiply-add equivalents, float32
against int8 on the target's int8 kernel (schedules/rules/int8.py: its peak int8/float32 rate), with the
quantize pass int8 adds per input element (cost.py). A layer whose int8 estimate is not below its
float32 one stays float; a whole int8 build predicted no faster than float32 warns with both
estimates (KilnWarning) and says so in the report.

The estimate counts the quantizable layers only (the rest of the model is the same in both builds)
and peak rates only: a bound on the gain, not a prediction of latency (benchmarks/isa.md measures)."""

from __future__ import annotations

import warnings

from tvm import relax

from ...errors import KilnWarning
from .cost import estimates, layer_cost
from .layers import LayerMutator


@relax.expr_functor.mutator
class _Costs(LayerMutator):
    def __init__(self, mod, onnx_model=None, keep_float=()):
        super().__init__(mod, onnx_model, keep_float)
        self.costs: dict[str, tuple[int, int, int]] = {}

    def on_layer(self, call, layer):
        self.costs[layer.name] = layer_cost(call)
        return call


def predict(mod, onnx_model, keep_float, quantized: list[str], kernel, why_none: str | None) -> dict:
    """The report's `speed` entry: both estimates (GMAC-equivalents at float32's rate) and their ratio."""
    costs = _Costs(mod, onnx_model, keep_float)
    costs.visit_expr(mod["main"])
    both = {
        name: estimates(c, kernel) if kernel is not None else (float(c[0]), float(c[0]))
        for name, c in costs.costs.items()
    }
    fp32 = sum(f for f, _ in both.values())
    int8 = sum(i if name in quantized else f for name, (f, i) in both.items())
    ratio = int8 / fp32 if fp32 else 1.0
    out = {
        "int8_kernel": kernel.path if kernel is not None else None,
        "float32_gmac": round(fp32 / 1e9, 4),  # GMAC-equivalents: multiply-adds and memory passes
        "int8_gmac_equivalent": round(int8 / 1e9, 4),
        "predicted_ratio": round(ratio, 3),
    }
    if kernel is not None and kernel.note:
        out["note"] = kernel.note
    if ratio >= 1.0:
        why = why_none or f"{len(quantized)} of {len(costs.costs)} layers are int8"
        out["warning"] = (
            f"the int8 build is predicted no faster than float32 (estimates: int8 {out['int8_gmac_equivalent']}, "
            f"float32 {out['float32_gmac']} GMAC-equivalents): {why}"
        )
    return out


def warn_if_slower(speed: dict, where: str) -> None:
    if "warning" in speed:
        warnings.warn(f"{where}: --quantize int8: {speed['warning']}", KilnWarning, stacklevel=3)
