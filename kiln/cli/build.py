"""`kiln compile` and `kiln tune`: the subcommands that build from a model (.onnx, .pt2 or .tflite)."""

from __future__ import annotations

from .flags import add_options, compile_options, given, pipeline_flags

ORDER = 10  # place in `kiln --help`
COMMANDS = {
    "compile": "compile an ONNX model to a .kiln artifact",
    "tune": "tune the model's kernels with MetaSchedule (resumable)",
}


def _compile(a) -> int:
    from ..compiler import compile_model
    from ..frontends.shapes import check_shape_buckets

    options = compile_options(a)
    check_shape_buckets(a.model, options)  # every bucket, before building any
    r = compile_model(a.model, a.output, options, report_path=a.report)
    m = r.manifest
    print(f"wrote {r.path} ({r.path.stat().st_size / 1e6:.2f} MB) for {m['target']} in {r.pass_seconds['total']:.1f} s")
    print(_frontend_line(m["source"]))
    q = r.report.get("quantization")
    if q:
        from ..compiler.report import format_quantization

        print(format_quantization(q))
    p = r.report.get("precision_accuracy")
    if p:
        from ..compiler.precision_flow import format_precision_accuracy

        print(format_precision_accuracy(p))
    elif options.precision != "fp32":
        print(f"--precision {options.precision}: add --calibration DATA to measure it against float32 on samples")
    return 0


def _frontend_line(src: dict) -> str:
    """Which frontend read the model, and what wrote it (the manifest's source)."""
    fw = src.get("framework") or {}
    made = (
        fw.get("saved_by") or fw.get("version") or (f"schema {fw['schema_version']}" if "schema_version" in fw else "")
    )
    return f"frontend {src.get('frontend', 'ONNX')}: {fw.get('name', 'onnx')} {made}".rstrip()


def _tune(a) -> int:
    from ..compiler.tune import compact, summary, tune
    from ..schedules.tuning.tuning import TuneOptions

    opts = TuneOptions(**given(TuneOptions, a))
    co = compile_options(a)
    r = tune(a.model, co, opts, progress=lambda line: print(line, flush=True), start=a.started)
    print(summary(co, r))  # in the words of the target's tuner (backends/)
    if a.compact:
        before, after = compact(co, r["db"])
        print(f"compacted {r['db']}: {before} records -> {after} (the best of each workload)")
    return 0


COMPILE_FIELDS = (
    "tuning_db",
    "shape_buckets",
    "bucket_policy",
    "pad_values",
    "max_memory",
    "quantize",
    "calibration",
    "calib_method",
    "calib_samples",
    "min_agreement",
    "keep_float",
)


def register(sub) -> None:
    from ..compiler.options import CompileOptions
    from ..schedules.tuning.tuning import TuneOptions

    c = sub.add_parser("compile", help=COMMANDS["compile"])
    c.add_argument("model")
    c.add_argument("-o", "--output", required=True)
    pipeline_flags(c)
    c.add_argument("--report", default=None, metavar="REPORT.json", help="write the optimization report")
    add_options(c, CompileOptions, *COMPILE_FIELDS)
    c.set_defaults(fn=_compile)
    t = sub.add_parser("tune", help=COMMANDS["tune"])
    t.add_argument("model")
    pipeline_flags(t)
    add_options(t.add_mutually_exclusive_group(required=True), TuneOptions, "trials", "budget_s")
    add_options(t, TuneOptions, "db_root", "rpc_tracker", "rpc_key", "rpc_workers")
    add_options(t, CompileOptions, "quantize", "calibration")  # an accelerator target needs them
    t.add_argument(
        "--compact", action="store_true", help="afterwards keep only the best record of each workload (for shipping)"
    )
    t.set_defaults(fn=_tune)
