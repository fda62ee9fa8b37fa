"""The optimization report's keys, declared: each pass module's COUNTERS (kiln/counters.py; the schedules'
passes included) and the keys the optimizer and the driver measure themselves (REPORT). optimize.py builds
every report from these (the counters marked `always` start at 0), and tests/compiler/test_report_keys.py
fails on a pass writing a key its module does not declare, or a printer (compiler/report.py) reading a key
nobody declares."""

from __future__ import annotations

import importlib
import pkgutil

from ..counters import Counter
from ..schedules.rules import apply, gpu
from . import passes

REPORT: tuple[Counter, ...] = (
    Counter("ops_before", dict, "op histogram of the imported graph"),
    Counter("batchnorm_total", int, "BatchNorms in the imported graph"),
    Counter("activation_bytes_unfused", int, "bytes of every op's output before any pass"),
    Counter("layout", str, "the layout the compile ran with"),
    Counter("pass_seconds", dict, "seconds per pipeline row, the import and the build"),
    Counter("passes_skipped", list, "rows the fallback ladder or a failing optional row turned off"),
    Counter("ops_after", dict, "op histogram after Kiln's graph passes"),
    Counter("conv_layouts", dict, "convs by data layout after the graph passes"),
    Counter("kernels", int, "kernels the model calls"),
    Counter("fused_groups", list, "fused kernels by name, with their call counts"),
    Counter("weights_bytes", int, "bytes of the lifted weights"),
    Counter("activation_bytes_naive", int, "bytes of every kernel output, no reuse"),
    Counter("activation_bytes_planned", int, "bytes of TVM's static memory plan"),
    Counter("buffers_planned", int, "buffers of TVM's static memory plan"),
    Counter("precision_note", str, "why --precision will not be faster on this target (or None)"),
    Counter("tuning_records", str, "which tuning records the compile applied, or why none"),
    Counter("layout_candidates_ms", dict, "--layout auto: each layout's measured milliseconds"),
    Counter("buckets", list, "with shape buckets: each bucket's own report"),
    Counter("quantization", dict, "--quantize: calibration, the layers and the accuracy check"),
    Counter("precision_accuracy", dict, "--precision bf16|fp16 --calibration: the build against float32"),
    Counter("vta", dict, "an accelerator target: the offloaded layers and their simulated cycles"),
)


def _pass_modules():
    """Kiln's pass modules (one per file under compiler/passes/) and the schedules' pass modules."""
    mods = [importlib.import_module(f"{passes.__name__}.{m.name}") for m in pkgutil.iter_modules(passes.__path__)]
    return [*mods, apply, gpu]


def module_counters(module) -> dict[str, Counter]:
    """{name: Counter} a module declares (every module-level tuple of Counters)."""
    out = {}
    for value in vars(module).values():
        if isinstance(value, tuple) and value and all(isinstance(c, Counter) for c in value):
            out.update({c.name: c for c in value})
    return out


def pass_counters() -> dict[str, Counter]:
    """Every counter any pass declares, by name."""
    out: dict[str, Counter] = {}
    for m in _pass_modules():
        out.update(module_counters(m))
    return out


def declared_keys() -> dict[str, Counter]:
    """Every key a report may hold: the passes' counters and the optimizer's and the driver's own."""
    return {**pass_counters(), **{c.name: c for c in REPORT}}


ALWAYS: tuple[str, ...] = tuple(name for name, c in pass_counters().items() if c.always)  # in every report, from 0
