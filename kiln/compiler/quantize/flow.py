"""Post-training static quantization inside a compile (the int8 row of compiler/flows.py): graph
passes up to the Quantize row, calibration on a float build with every layer's input and output
tapped (quantize/calibrate.py, shared with the accelerator), the QuantizeGraph rewrite, then the
rest of the pipeline; and the accuracy check on held-out samples (the float build against an int8
build with each int8 layer's output tapped)."""

from __future__ import annotations

import time

from ...errors import tvm_errors
from ..hostrun import missing_on_host
from ..optimize import Optimized, optimize
from .accuracy import check_agreement, compare
from .calibrate import build_tapped, calibrate, finish
from .rewrite import CalibrationTaps, QuantizeGraph, shared_ranges
from .speed import predict, warn_if_slower


def quantize_flow(imported, options, layout: str, where: str) -> Optimized:
    """The optimized int8 module; its report's `quantization` section says which layers are int8,
    which stay float and why, and how close the int8 build is to the float one."""
    t0 = time.perf_counter()
    pre = optimize(imported.mod, options, layout=layout, where=where, part="pre")
    taps = CalibrationTaps(pre.mod, imported.onnx_model, options.keep_float)
    tapped, names = taps.run(pre.mod), [n for n, _ in taps.taps]
    cal = calibrate(tapped, names, imported, options, layout, where)
    calib, held = cal.calib, cal.held
    float_model = cal.model or build_tapped(tapped, names, imported, options, layout, where)  # no layers: untapped
    ranges = shared_ranges({k: v for k, v in cal.ranges.items() if not k.endswith(":out")}, taps.shared)
    calibrate_s = time.perf_counter() - t0

    caps = options.target.caps  # the target's int8 kernel: which layers pay, their channel block and weight range
    rewrite = QuantizeGraph(pre.mod, ranges, imported.onnx_model, options.keep_float, caps=caps)
    opt = finish(pre, rewrite.run(pre.mod), options, layout, where)

    t1 = time.perf_counter()
    check = QuantizeGraph(pre.mod, ranges, imported.onnx_model, options.keep_float, taps=True, caps=caps)
    checked = check.run(pre.mod)
    quant_model = build_tapped(checked, [n for n, _ in check.taps], imported, options, layout, where)
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
    return opt
