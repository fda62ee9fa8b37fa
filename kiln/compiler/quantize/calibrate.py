"""The calibration run int8 quantization and the accelerator share. Both flows run the graph
passes up to the Quantize row (optimize part="pre"), tap the values they need ranges of (each
flow its own taps), then `calibrate`: load the calibration data, build the tapped module for this
host, run the calibration samples through it and collect every tap's range. After the flow's
rewrite, `finish` runs the rest of the pipeline and merges the two parts' reports."""

from __future__ import annotations

import dataclasses

from ...errors import tvm_errors
from ..executable import build_executable
from ..hostrun import host_options
from ..optimize import COUNTERS, Optimized, optimize
from ..report_keys import pass_counters
from .calibration import CalibrationSet, RangeCollector, load_calibration


@dataclasses.dataclass
class TappedBuild:
    """An in-process build of a tapped module: run(feed) -> (outputs, {tap name: array})."""

    vm: object
    weights: list
    inputs: list
    tap_names: list[str]

    def run(self, feed: dict):
        import tvm

        dev = tvm.cpu()
        out = self.vm["main"](
            *[tvm.runtime.tensor(feed[i.name], dev) for i in self.inputs],
            *[tvm.runtime.tensor(w, dev) for w in self.weights],
        )
        if not self.tap_names:  # nothing tapped (an int8 build with no int8 layer): the outputs alone
            return [o.numpy() for o in ([out] if hasattr(out, "numpy") else list(out))], {}
        main, taps = (out[0], out[1]) if self.tap_names else (out, [])  # untapped: main's outputs as they are
        outs = [main] if hasattr(main, "numpy") else list(main)
        return [o.numpy() for o in outs], {n: t.numpy() for n, t in zip(self.tap_names, taps)}


@dataclasses.dataclass
class Calibration:
    """What `calibrate` found: each tap's [lo, hi], the samples it used and those held out (the
    int8 accuracy check runs on them), and the tapped float build (None when nothing was tapped)."""

    ranges: dict[str, tuple[float, float]]
    calib: CalibrationSet
    held: CalibrationSet | None
    model: TappedBuild | None


def build_tapped(mod, tap_names, imported, options, layout, where) -> TappedBuild:
    """The rest of the pipeline on a tapped module, built for this host (calibration and the accuracy
    check run here, whatever the target) and loaded into a VM."""
    options = host_options(options)
    return load_build(
        optimize(mod, options, layout=layout, where=where, part="post"), tap_names, imported, options, where
    )


def load_build(opt: Optimized, tap_names, imported, options, where) -> TappedBuild:
    """An optimized module built for this host (options: ones whose target runs here) and loaded into a VM."""
    import tvm
    from tvm import relax

    exe = build_executable(opt.mod, options, where)
    with tvm_errors("Running the model for calibration", where):
        vm = relax.VirtualMachine(exe, tvm.cpu())
    return TappedBuild(vm, opt.weights, imported.inputs, tap_names)


def collect_ranges(model: TappedBuild, calib, method: str, where: str) -> dict:
    """Every tap's calibrated [lo, hi] over the calibration samples (a second pass builds the
    histograms percentile and entropy need)."""
    collector = RangeCollector(method)
    passes = [collector.observe] + ([collector.observe_histogram] if collector.needs_histogram else [])
    with tvm_errors("Running the model for calibration", where):
        for observe in passes:
            for i in range(len(calib)):
                for name, a in model.run(calib.feed(i))[1].items():
                    observe(name, a)
    return collector.ranges()


def calibrate(tapped, tap_names: list[str], imported, options, layout: str, where: str) -> Calibration:
    """The calibration data (--calibration, split by --calib-samples), and the ranges of the taps
    `tapped` (the pre part's module with taps appended to main's outputs) has over it."""
    calib, held = load_calibration(options.calibration, imported.inputs).split(options.calib_samples)
    if not tap_names:
        return Calibration({}, calib, held, None)
    model = build_tapped(tapped, tap_names, imported, options, layout, where)
    return Calibration(collect_ranges(model, calib, options.calib_method, where), calib, held, model)


def finish(pre: Optimized, mod, options, layout: str, where: str) -> Optimized:
    """The pipeline after the Quantize row on the flow's rewritten module; the report also counts
    what the pre part did (it saw the imported graph: its op histogram and counters)."""
    opt = optimize(mod, options, layout=layout, where=where, part="post")
    merge_reports(pre.report, opt.report)
    return opt


def merge_reports(pre: dict, post: dict) -> None:
    """The pre part's op histogram and counters into the post part's report."""
    for k in ("ops_before", "batchnorm_total", "activation_bytes_unfused"):
        post[k] = pre[k]
    for k in COUNTERS:
        post[k] = post.get(k, 0) + pre.get(k, 0)
    for k, c in pass_counters().items():  # the pre part's passes that count only once they run
        if k in pre and k not in COUNTERS and c.type is int:
            post[k] = post.get(k, 0) + pre[k]
    if "zero_channel_layers" in pre:  # RemoveZeroChannels runs before the Quantize row
        post["zero_channel_layers"] = pre["zero_channel_layers"]
    post["pass_seconds"] = {**pre["pass_seconds"], **post["pass_seconds"]}
