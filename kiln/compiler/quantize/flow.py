"""Post-training static quantization inside a compile: graph passes up to the Quantize row, a
float build with every layer's input and output tapped, calibration on the first samples, the
QuantizeGraph rewrite, then the rest of the pipeline; and the accuracy check on held-out samples
(the float build against an int8 build with each int8 layer's output tapped)."""

from __future__ import annotations

import dataclasses
import time

from ...errors import tvm_errors
from ..hostrun import host_options, missing_on_host
from ..optimize import COUNTERS, Optimized, optimize
from ..options import CompileOptions
from .accuracy import check_agreement, compare
from .calibration import RangeCollector, load_calibration
from .rewrite import CalibrationTaps, QuantizeGraph
from .speed import predict, warn_if_slower


@dataclasses.dataclass
class _Tapped:
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
        main, taps = out[0], out[1]
        outs = [main] if hasattr(main, "numpy") else list(main)
        return [o.numpy() for o in outs], {n: t.numpy() for n, t in zip(self.tap_names, taps)}


def _build_tapped(mod, tap_names, imported, options, layout, where) -> _Tapped:
    import tvm
    from tvm import relax

    from ..build import build_executable

    options = host_options(options)  # calibration and the accuracy check run here, whatever the target
    opt = optimize(mod, options, layout=layout, where=where, part="post")
    exe = build_executable(opt.mod, options, where)
    with tvm_errors("Running the model for calibration", where):
        vm = relax.VirtualMachine(exe, tvm.cpu())
    return _Tapped(vm, opt.weights, imported.inputs, tap_names)


def collect_ranges(model: _Tapped, calib, method: str, where: str) -> dict:
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


def quantize_optimize(imported, options: CompileOptions, layout: str, where: str) -> tuple[Optimized, dict]:
    """(the optimized int8 module, the quantization report)."""
    t0 = time.perf_counter()
    pre = optimize(imported.mod, options, layout=layout, where=where, part="pre")
    data = load_calibration(options.calibration, imported.inputs)
    calib, held = data.split(options.calib_samples)
    taps = CalibrationTaps(pre.mod, imported.onnx_model, options.keep_float)
    tapped = taps.run(pre.mod)
    float_model = _build_tapped(tapped, [n for n, _ in taps.taps], imported, options, layout, where)
    ranges = {
        k: v
        for k, v in collect_ranges(float_model, calib, options.calib_method, where).items()
        if not k.endswith(":out")
    }
    calibrate_s = time.perf_counter() - t0

    caps = options.target.caps  # the target's int8 kernel: which layers pay, their channel block and weight range
    rewrite = QuantizeGraph(pre.mod, ranges, imported.onnx_model, options.keep_float, caps=caps)
    opt = optimize(rewrite.run(pre.mod), options, layout=layout, where=where, part="post")
    _merge_reports(pre.report, opt.report)

    t1 = time.perf_counter()
    check = QuantizeGraph(pre.mod, ranges, imported.onnx_model, options.keep_float, taps=True, caps=caps)
    checked = check.run(pre.mod)
    quant_model = _build_tapped(checked, [n for n, _ in check.taps], imported, options, layout, where)
    evaluate = held if held is not None else calib
    fl, ql, fo, qo = [], [], [], []
    with tvm_errors("Running the model for the accuracy check", where):
        for i in range(len(evaluate)):
            outs, t = float_model.run(evaluate.feed(i))
            fo.append(outs)
            fl.append({n.removesuffix(":out"): a for n, a in t.items() if n.endswith(":out")})
            outs, t = quant_model.run(evaluate.feed(i))
            qo.append(outs)
            ql.append(t)
    accuracy = compare([o.name for o in imported.outputs], fo, qo, rewrite.quantized, fl, ql)
    accuracy["held_out"] = held is not None
    accuracy["measured_on"] = (
        "target" if not missing_on_host(options.target) else "host build (the target's code cannot run here)"
    )
    report = {
        "mode": "int8",
        "calib_method": options.calib_method,
        "calib_samples": len(calib),
        "calibration": calib.source,
        "calibration_sha256": calib.digest,
        "int8_layers": rewrite.quantized,
        "float_layers": {
            l.name: l.reason or "no calibration range" for l in rewrite.layers if l.name not in rewrite.quantized
        },
        "accuracy": accuracy,
        "speed": predict(
            pre.mod, imported.onnx_model, options.keep_float, rewrite.quantized, rewrite.int8, rewrite.no_kernel
        ),
        "seconds": {"calibrate": round(calibrate_s, 3), "accuracy_check": round(time.perf_counter() - t1, 3)},
    }
    opt.report["quantization"] = report
    warn_if_slower(report["speed"], where)
    check_agreement(accuracy, options.min_agreement, where)
    return opt, report


def _merge_reports(pre: dict, post: dict) -> None:
    """The pre part saw the imported graph: its op histogram and counters belong in the report."""
    for k in ("ops_before", "batchnorm_total", "activation_bytes_unfused"):
        post[k] = pre[k]
    for k in COUNTERS:
        post[k] = post.get(k, 0) + pre.get(k, 0)
    post["pass_seconds"] = {**pre["pass_seconds"], **post["pass_seconds"]}
