"""--precision bf16|fp16 with --calibration DATA: the pass pipeline as the plain flow runs it, then the
reduced-precision build's accuracy against the float32 build of the same model on those samples, measured on this
host as the int8 flow measures its own (kiln compile prints it, the report keeps it under `precision_accuracy`):
per output max and mean abs error and cosine, top-1 agreement for classifiers. Without --calibration nothing is
measured (two more host builds of the model: the check is asked for, not paid on every compile)."""

from __future__ import annotations

import dataclasses
import time

from ..errors import tvm_errors
from .hostrun import missing_on_host
from .optimize import Optimized, optimize
from .quantize.accuracy import compare
from .quantize.calibrate import build_tapped, finish, load_build
from .quantize.calibration import load_calibration


def precision_flow(imported, options, layout: str, where: str) -> Optimized:
    """The optimized reduced-precision module; its report's `precision_accuracy` compares it with float32."""
    pre = optimize(imported.mod, options, layout=layout, where=where, part="pre")
    opt = finish(pre, pre.mod, options, layout, where)
    t = time.perf_counter()
    samples = load_calibration(options.calibration, imported.inputs)
    fp32 = build_tapped(pre.mod, [], imported, dataclasses.replace(options, precision="fp32"), layout, where)
    here = not missing_on_host(options.target)  # the artifact's own module runs here: no second optimize
    reduced = (
        load_build(opt, [], imported, options, where)
        if here
        else build_tapped(pre.mod, [], imported, options, layout, where)
    )
    fo, ro = [], []
    with tvm_errors("Running the model for the precision check", where):
        for i in range(len(samples)):
            fo.append(fp32.run(samples.feed(i))[0])
            ro.append(reduced.run(samples.feed(i))[0])
    accuracy = compare([o.name for o in imported.outputs], fo, ro, [], [], [])
    accuracy["measured_on"] = "target" if here else "host build (the target's code cannot run here)"
    opt.report["precision_accuracy"] = {
        "precision": options.precision,
        "calibration": samples.source,
        "accuracy": accuracy,
        "seconds": round(time.perf_counter() - t, 3),
    }
    return opt


def format_precision_accuracy(p: dict) -> str:
    """What `kiln compile --precision bf16 --calibration DATA` prints."""
    from .report import format_accuracy_lines

    lines = format_accuracy_lines(p["accuracy"], "the float32 build", f"samples of {p['calibration']}")
    return "\n".join(line for line in lines if not line.startswith("  largest layer errors"))
