"""Run the pipeline on an imported model and measure what it did: the optimization report."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections import Counter

import tvm

from ..errors import KilnWarning, PassError, pass_errors, tvm_errors
from . import analysis, ir
from .passes import LiftWeights
from .passes.convert_layout import count_layout_transforms
from .report_keys import ALWAYS

COUNTERS = ALWAYS  # the passes' counters every report holds, from 0 (declared in each pass module)


@dataclasses.dataclass
class Optimized:
    """What a build flow gives the driver: the module to build, its lifted weights, the report (a
    flow adds its own section), and artifact members beside the library and weights (the accelerator's)."""

    mod: tvm.IRModule
    weights: list
    report: dict
    members: dict[str, bytes] = dataclasses.field(default_factory=dict)


PARTS = ("all", "pre", "post")
SPLIT = "Quantize"  # part="pre" runs the rows before it, part="post" the rest (calibration runs in between)


def optimize(
    mod: tvm.IRModule,
    options,
    layout: str | None = None,
    where: str = "<model>",
    part: str = "all",
    quantize=None,
) -> Optimized:
    """Pipeline + weight lifting: the rows of the options' backend (CompileOptions.backend). `layout`
    overrides options.layout (used by layout=auto). A TVM failure inside (a model TVM's passes reject, e.g.
    convolution parameters with no valid output) is a CompileError naming the pass. part="pre" stops before
    the Quantize row (no lowering, no lifting: the graph calibration taps); `quantize` is the pass the
    Quantize row runs."""
    with tvm_errors("Kiln's optimization pipeline", where, "rerun with --debug for the full trace"):
        return _optimize(mod, options, layout, part, quantize, where)


def _run_row(spec, p, mod, report: dict, where: str):
    """One row. A required row's failure is a PassError for the compile's fallback; an optional row
    that raises is skipped (the module as it was before it), warned about and recorded."""
    if spec.required or spec.name == SPLIT:
        with pass_errors(spec.name, where):
            return p(mod)
    try:
        return p(mod)
    except Exception as e:
        err = PassError(spec.name, e, where=where, fix="the compile goes on without this pass")
        report["passes_skipped"].append(
            {"rung": "pass", "passes": [spec.name], "failed_in": spec.name, "error": err.detail, "node": None}
        )
        warnings.warn(
            f"{where}: optional pass {spec.name} failed ({err.detail[:300]}); compiled without it "
            "(the artifact is correct but may be slower; please report the model)",
            KilnWarning,
            stacklevel=2,
        )
        return mod


def _rows(specs, part: str):
    names = [s.name for s in specs]
    cut = names.index(SPLIT) if SPLIT in names else next(i for i, s in enumerate(specs) if not s.graph)
    return specs[:cut] if part == "pre" else specs[cut:] if part == "post" else specs


def _optimize(
    mod: tvm.IRModule,
    options,
    layout: str | None,
    part: str = "all",
    quantize=None,
    where: str = "<model>",
) -> Optimized:
    if layout is not None:
        options = dataclasses.replace(options, layout=layout)
    report: dict = {
        "ops_before": analysis.op_histogram(mod),
        "batchnorm_total": analysis.count_op(mod, "nn.batch_norm"),
        "activation_bytes_unfused": analysis.activation_bytes_unfused(mod),
        **{k: 0 for k in COUNTERS},
        "layout": options.layout,
        "pass_seconds": {},
        "passes_skipped": [],
    }
    specs = _rows(options.backend.pipeline(options.opt_level, options.disabled_passes), part)
    transforms_in_model = count_layout_transforms(mod)
    seconds: Counter = Counter()
    with options.target.tvm(), tvm.transform.PassContext(opt_level=3):
        for spec in specs:
            if not spec.graph and "ops_after" not in report:
                report["ops_after"] = analysis.op_histogram(mod)
                report["conv_layouts"] = analysis.conv_layouts(mod)
                # the transforms left after all graph passes (ConvertLayout's count is before PropagateBlockedLayout)
                report["layout_transforms"] = count_layout_transforms(mod) - transforms_in_model
            p = quantize if spec.name == SPLIT else spec.make(options)
            if p is None:
                continue
            t = time.perf_counter()
            mod = _run_row(spec, p, mod, report, where)
            seconds[spec.name] += time.perf_counter() - t
            for k, v in getattr(p, "stats", {}).items():
                report[k] = report[k] + v if k in report else v  # counts add up, per-layer lists extend
        if part == "pre":
            report["pass_seconds"] = {k: round(v, 4) for k, v in seconds.items()}
            return Optimized(mod, [], report)
        lift = LiftWeights()
        t = time.perf_counter()
        mod = lift(mod)
        seconds["LiftWeights"] += time.perf_counter() - t
    report.setdefault("ops_after", analysis.op_histogram(mod))
    calls = ir.kernels(mod)
    report["kernels"] = len(calls)
    report["fused_groups"] = [
        {"name": n, "calls": c} for n, c in Counter(calls).most_common() if n.startswith("fused_")
    ]
    report["weights_bytes"] = int(sum(w.nbytes for w in lift.weights))
    report["activation_bytes_naive"] = analysis.activation_bytes_naive(mod)
    t = time.perf_counter()
    report["activation_bytes_planned"], report["buffers_planned"] = analysis.planned_storage(mod)
    seconds["MemoryPlanAnalysis"] += time.perf_counter() - t
    report["pass_seconds"] = {k: round(v, 4) for k, v in seconds.items()}
    return Optimized(mod, lift.weights, report)
