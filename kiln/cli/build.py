"""`kiln compile` and `kiln tune`: the subcommands that build from a model (.onnx, .pt2 or .tflite)."""

from __future__ import annotations

from ..runtime.artifact import BUCKET_POLICIES
from .flags import compile_options, pipeline_flags

ORDER = 10  # place in `kiln --help`


def _compile(a) -> int:
    from ..compiler import compile_model

    r = compile_model(a.model, a.output, compile_options(a), report_path=a.report)
    m = r.manifest
    print(f"wrote {r.path} ({r.path.stat().st_size / 1e6:.2f} MB) for {m['target']} in {r.pass_seconds['total']:.1f} s")
    print(_frontend_line(m["source"]))
    q = r.report.get("quantization")
    if q:
        from ..compiler.report import format_quantization

        print(format_quantization(q))
    return 0


def _frontend_line(src: dict) -> str:
    """Which frontend read the model, and what wrote it (the manifest's source)."""
    fw = src.get("framework") or {}
    made = (
        fw.get("saved_by") or fw.get("version") or (f"schema {fw['schema_version']}" if "schema_version" in fw else "")
    )
    return f"frontend {src.get('frontend', 'ONNX')}: {fw.get('name', 'onnx')} {made}".rstrip()


def _tune(a) -> int:
    from ..schedules.tuning import TuneOptions, format_summary, parse_duration, tune

    opts = TuneOptions(
        db_root=a.db,
        trials=a.trials,
        budget_s=parse_duration(a.budget) if a.budget else None,
        rpc_tracker=a.rpc_tracker,
        rpc_key=a.rpc_key,
        rpc_workers=a.rpc_workers,
    )
    r = tune(a.model, compile_options(a), opts, progress=lambda line: print(line, flush=True))
    print(format_summary(r))
    if a.compact:
        from ..schedules.database import compact

        before, after = compact(r["db"])
        print(f"compacted {r['db']}: {before} records -> {after} (the best of each workload)")
    return 0


def register(sub) -> None:
    c = sub.add_parser("compile", help="compile an ONNX model to a .kiln artifact")
    c.add_argument("model")
    c.add_argument("-o", "--output", required=True)
    pipeline_flags(c)
    c.add_argument("--report", default=None, metavar="REPORT.json", help="write the optimization report")
    c.add_argument(
        "--tuning-db",
        default=None,
        metavar="DIR",
        help="apply tuned records from this database (kiln tune --db); default: the records Kiln ships in "
        "tuning_logs/ for this exact target, if any; 'none': default schedules only",
    )
    c.add_argument(
        "--shape-buckets",
        action="append",
        default=None,
        metavar="NAME:1x3x224x224,4x3x224x224",
        help="one function per bucket (repeat per input; bucket i takes each input's i-th shape)",
    )
    c.add_argument(
        "--max-memory",
        default=None,
        metavar="SIZE",
        help="refuse models whose planned memory (activations + weights) "
        "exceeds it, e.g. 512M, 2G (checked before building)",
    )
    c.add_argument(
        "--quantize", default=None, metavar="int8", help="post-training static quantization (needs --calibration)"
    )
    c.add_argument(
        "--calibration",
        default=None,
        metavar="DATA.npz|DIR",
        help="arrays keyed by input name, samples stacked on the batch axis (16x3x224x224 = 16 samples of 1x3x224x224)",
    )
    c.add_argument("--calib-method", default="minmax", metavar="minmax|percentile|entropy")
    c.add_argument(
        "--calib-samples",
        type=int,
        default=None,
        metavar="N",
        help="calibrate on the first N samples, check accuracy on the rest (default: hold out a quarter)",
    )
    c.add_argument(
        "--min-agreement",
        type=float,
        default=None,
        metavar="X",
        help="fail unless top-1 agreement with the float model (cosine for non-classifiers) is at least X",
    )
    c.add_argument(
        "--keep-float",
        action="append",
        default=[],
        metavar="LAYER",
        help="repeatable: keep this layer (ONNX node name) float",
    )
    c.add_argument(
        "--bucket-policy",
        default="pad",
        choices=BUCKET_POLICIES,
        help="inputs between buckets: zero-pad to the next bucket and crop outputs (default), or refuse",
    )
    c.set_defaults(fn=_compile)
    t = sub.add_parser("tune", help="tune the model's kernels with MetaSchedule (resumable)")
    t.add_argument("model")
    pipeline_flags(t)
    g = t.add_mutually_exclusive_group(required=True)
    g.add_argument("--trials", type=int, default=None)
    g.add_argument("--budget", default=None, metavar="DURATION", help="wall-clock budget, e.g. 90s, 20m, 1.5h")
    t.add_argument("--db", default="tuning_logs", metavar="DIR", help="database root (default tuning_logs/)")
    t.add_argument(
        "--rpc-tracker",
        default=None,
        metavar="HOST:PORT",
        help="measure on the devices of TVM's RPC tracker (needs --rpc-key)",
    )
    t.add_argument("--rpc-key", default=None, metavar="KEY", help="the key the RPC servers registered with")
    t.add_argument(
        "--rpc-workers", type=int, default=None, metavar="N", help="devices measured in parallel (default: all free)"
    )
    t.add_argument(
        "--compact", action="store_true", help="afterwards keep only the best record of each workload (for shipping)"
    )
    t.set_defaults(fn=_tune)
