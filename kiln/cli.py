"""The `kiln` command line, thin over the public API. Exit codes: 0 success, 2 user error (bad
model, input, artifact or option: one line on stderr), 1 internal error. --debug shows tracebacks."""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from .errors import KilnError, OptionsError
from .runtime.artifact import BUCKET_POLICIES


def _options(a):
    from .compiler import CompileOptions

    return CompileOptions.make(
        target=a.target,
        input_shapes=a.input_shape,
        opt_level=a.opt_level,
        disabled_passes=tuple(a.disable_pass),
        layout=a.layout,
        tuning_db=getattr(a, "tuning_db", None),
        shape_buckets=getattr(a, "shape_buckets", None),
        bucket_policy=getattr(a, "bucket_policy", "pad"),
        max_memory=getattr(a, "max_memory", None),
        quantize=getattr(a, "quantize", None),
        calibration=getattr(a, "calibration", None),
        calib_method=getattr(a, "calib_method", "minmax"),
        calib_samples=getattr(a, "calib_samples", None),
        min_agreement=getattr(a, "min_agreement", None),
        keep_float=tuple(getattr(a, "keep_float", ()) or ()),
        precision=getattr(a, "precision", "fp32"),
        freeze_inputs=tuple(getattr(a, "freeze_input", ()) or ()),
    )


def _tune(a) -> int:
    from .schedules.tuning import TuneOptions, format_summary, parse_duration, tune

    opts = TuneOptions(
        db_root=a.db,
        trials=a.trials,
        budget_s=parse_duration(a.budget) if a.budget else None,
        rpc_tracker=a.rpc_tracker,
        rpc_key=a.rpc_key,
        rpc_workers=a.rpc_workers,
    )
    r = tune(a.model, _options(a), opts, progress=lambda line: print(line, flush=True))
    print(format_summary(r))
    if a.compact:
        from .schedules.database import compact

        before, after = compact(r["db"])
        print(f"compacted {r['db']}: {before} records -> {after} (the best of each workload)")
    return 0


def _compile(a) -> int:
    from .compiler import compile_model

    r = compile_model(a.model, a.output, _options(a), report_path=a.report)
    m = r.manifest
    print(f"wrote {r.path} ({r.path.stat().st_size / 1e6:.2f} MB) for {m['target']} in {r.pass_seconds['total']:.1f} s")
    q = r.report.get("quantization")
    if q:
        from .compiler.report import format_quantization

        print(format_quantization(q))
    return 0


def _unpack(a) -> int:
    """Verify an artifact and write its members into a folder (for kiln_run, the C++ runner)."""
    import shutil
    import tempfile
    from pathlib import Path

    from .runtime import artifact as art

    manifest, members = art.read_artifact(
        a.model, trusted_keys=a.trusted_key or None
    )  # checksums (and signature) verified
    out = Path(a.directory)
    if out.exists() and any(out.iterdir()):
        raise OptionsError(f"{out} is not empty", where=str(out), fix="give a new or empty folder")
    tmp = Path(tempfile.mkdtemp(prefix=".kiln-unpack-", dir=out.parent if out.parent.exists() else None))
    for name, data in members.items():
        (tmp / name).write_bytes(data)
    (tmp / art.MANIFEST).write_text(json.dumps(manifest, indent=2))
    if out.exists():
        out.rmdir()
    shutil.move(str(tmp), str(out))
    print(f"unpacked {len(members)} members and {art.MANIFEST} of {a.model} into {out}")
    return 0


def _run(a) -> int:
    import numpy as np

    from ._io import atomic_open
    from .runtime import load

    model = load(
        a.model, num_threads=a.threads, trusted_keys=a.trusted_key or None
    )  # checked before the inputs are read
    try:
        with np.load(a.inputs, allow_pickle=False) as z:
            feed = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise OptionsError(
            f"cannot read inputs file: {e}", where=a.inputs, fix="give an .npz whose keys are the model's input names"
        ) from None
    outs = model.run(feed)
    with atomic_open(a.output, "wb") as f:
        np.savez(f, **outs)
    print(f"wrote {a.output}: " + ", ".join(f"{k} {'x'.join(map(str, v.shape))} {v.dtype}" for k, v in outs.items()))
    return 0


def _bench(a) -> int:
    from ._io import atomic_write_text
    from .runtime.bench import BenchOptions, bench, format_bench

    if a.plot:
        from .runtime.profile import check_plot

        check_plot()  # before any run
    r = bench(
        a.model,
        BenchOptions(
            threads=a.threads,
            warmup=a.warmup,
            repeat=a.repeat,
            seconds=a.seconds,
            onnx=a.onnx,
            trusted_keys=tuple(a.trusted_key) or None,
        ),
    )
    print(format_bench(r))
    if a.profile:
        from .runtime.profile import ProfileOptions, format_profile, plot_profile, profile

        popts = ProfileOptions(
            threads=a.threads,
            warmup=a.warmup,
            repeat=min(a.repeat or 50, 200),
            trusted_keys=tuple(a.trusted_key) or None,
        )
        r["profile"] = profile(a.model, popts)
        print(format_profile(r["profile"]))
    if a.json:
        atomic_write_text(a.json, json.dumps(r, indent=2))
    if a.plot:
        from .runtime.plot import latency_histogram

        latency_histogram(r, a.plot)
        if a.profile:  # the kernels' chart beside the histogram: OUT.png -> OUT.kernels.png
            plot_profile(r["profile"], (a.plot[:-4] if a.plot.endswith(".png") else a.plot) + ".kernels.png")
    return 0


def _profile(a) -> int:
    from ._io import atomic_write_text
    from .runtime.profile import ProfileOptions, check_plot, format_profile, plot_profile, profile

    if a.plot:
        check_plot()  # before any run
    p = profile(
        a.model,
        ProfileOptions(
            threads=a.threads, warmup=a.warmup, repeat=a.repeat, top=a.top, trusted_keys=tuple(a.trusted_key) or None
        ),
    )
    print(format_profile(p))
    if a.json:
        atomic_write_text(a.json, json.dumps(p, indent=2))
    if a.plot:
        plot_profile(p, a.plot)
    return 0


def _serve(a) -> int:
    from .serve import ServeOptions

    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise OptionsError(
            "kiln serve needs aiohttp, which is not installed",
            where="kiln serve",
            fix="pip install 'kiln[serve]' (or pip install aiohttp)",
        ) from None
    opts = ServeOptions.make(
        ([a.model] if a.model else []) + a.models,
        split=a.split,
        name=a.name,
        host=a.host,
        port=a.port,
        max_batch=a.max_batch,
        max_wait_ms=a.max_wait_ms,
        queue=a.queue,
        timeout_ms=a.timeout_ms,
        workers=a.workers,
        threads=a.threads,
        max_body_mb=a.max_body_mb,
        warmup=not a.no_warmup,
        trusted_keys=tuple(a.trusted_key) or None,
    )
    if a.workers > 1:
        from .serve.workers import run_workers

        return run_workers(a.argv[a.argv.index("serve") + 1 :], a.workers, a.port, a.threads)
    from .serve.app import serve

    serve(opts, reuse_port=a.reuse_port)
    return 0


def _keygen(a) -> int:
    from .sign import keygen

    kid = keygen(a.private, a.public)
    print(
        f"wrote {a.private} (private, mode 600: keep it secret) and {a.public} (public: give it to loaders); key id {kid}"
    )
    return 0


def _sign(a) -> int:
    from .sign import sign

    kid = sign(a.model, a.key)
    print(f"signed {a.model} with key {kid}")
    return 0


def _inspect(a) -> int:
    from .describe import format_capabilities, format_text, inspect_path, target_capabilities

    if a.model is None:  # `kiln inspect --target T`: what the target's hardware can do
        if a.target is None or a.passes:
            raise OptionsError(
                "give a model, or --target alone to see a target's capabilities",
                where="kiln inspect",
                fix='kiln inspect MODEL [--passes] or kiln inspect --target "llvm -mcpu=haswell"',
            )
        caps = target_capabilities(a.target)
        print(json.dumps(caps.to_json(), indent=2) if a.json else format_capabilities(caps))
        return 0
    if a.passes:
        from .compiler.build import analyze_model
        from .compiler.report import format_report

        report = analyze_model(a.model, _options(a))
        print(json.dumps(report, indent=2) if a.json else format_report(report))
        return 0
    info = inspect_path(a.model)
    caps = target_capabilities(a.target) if a.target is not None else None
    if a.json:
        print(json.dumps({**info, "capabilities": caps.to_json()} if caps else info, indent=2))
    else:
        print(format_text(info) + ("\n" + format_capabilities(caps) if caps else ""))
    return 0


def _pipeline_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="default: the host CPU, detected")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:1x3x224x224")
    p.add_argument(
        "--freeze-input",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="repeatable: compile this input in as a constant (a scalar or small array, e.g. sr=16000, "
        "axes=[0,2]); Ifs and shapes that depend on it fold away",
    )
    p.add_argument(
        "--opt-level", type=int, default=2, help="0: lowering only, 1: + graph clean-up, 2: + fusion (default)"
    )
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME", help="repeatable")
    p.add_argument(
        "--layout",
        default="NCHWc",
        help="NCHWc (default: channels blocked by the vector width), NCHW, NHWC, or auto (measure all on this host)",
    )
    p.add_argument(
        "--precision",
        default="fp32",
        metavar="fp32|fp16|bf16",
        help="mixed precision with fp32 accumulation (kiln tune: tune the kernels of that build)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln", description="Ahead-of-time deep-learning compiler on Apache TVM.")
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile an ONNX model to a .kiln artifact")
    c.add_argument("model")
    c.add_argument("-o", "--output", required=True)
    _pipeline_flags(c)
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
    _pipeline_flags(t)
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
    r = sub.add_parser("run", help="run an artifact on inputs from an .npz")
    r.add_argument("model")
    r.add_argument("--inputs", required=True, metavar="IN.npz")
    r.add_argument("-o", "--output", required=True, metavar="OUT.npz")
    r.add_argument("--threads", type=int, default=None)
    r.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="PUBLIC.pem",
        help="refuse the artifact unless one of these keys signed it (repeatable)",
    )
    r.set_defaults(fn=_run)
    b = sub.add_parser(
        "bench", help="latency percentiles, QPS, cold start and peak RSS (optionally beside onnxruntime)"
    )
    b.add_argument("model")
    b.add_argument(
        "--onnx", default=None, metavar="MODEL.onnx", help="also run onnxruntime on the same input, alternating"
    )
    b.add_argument("--threads", type=int, default=None, help="default: physical cores")
    b.add_argument("--warmup", type=int, default=5)
    g = b.add_mutually_exclusive_group()
    g.add_argument("--repeat", type=int, default=None, help="number of timed runs")
    g.add_argument("--seconds", type=float, default=10.0, help="time budget for timed runs (default 10)")
    b.add_argument("--json", default=None, metavar="OUT.json")
    b.add_argument(
        "--plot",
        default=None,
        metavar="OUT.png",
        help="latency histogram (needs matplotlib); with --profile also the kernels' chart, OUT.kernels.png",
    )
    b.add_argument(
        "--profile", action="store_true", help="then time every kernel (see kiln profile); in --json as 'profile'"
    )
    b.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="PUBLIC.pem",
        help="refuse the artifact unless one of these keys signed it (repeatable)",
    )
    b.set_defaults(fn=_bench)
    f = sub.add_parser(
        "profile",
        help="time every kernel: source ONNX ops, ms, share, GFLOP/s and %% of this CPU's "
        "peak, bytes, tuned or default",
    )
    f.add_argument("model")
    f.add_argument("--threads", type=int, default=None, help="default: physical cores")
    f.add_argument("--warmup", type=int, default=5)
    f.add_argument(
        "--repeat", type=int, default=50, help="profiled runs (as many plain runs alternate, for the latency)"
    )
    f.add_argument("--top", type=int, default=15, help="kernels in the table (--json has all)")
    f.add_argument("--json", default=None, metavar="OUT.json")
    f.add_argument("--plot", default=None, metavar="OUT.png", help="bar chart of the kernels' times (needs matplotlib)")
    f.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="PUBLIC.pem",
        help="refuse the artifact unless one of these keys signed it (repeatable)",
    )
    f.set_defaults(fn=_profile)
    s = sub.add_parser("serve", help="HTTP inference server with dynamic batching (POST /v1/models/<name>:predict)")
    s.add_argument("model", nargs="?", default=None, metavar="MODEL.kiln")
    s.add_argument(
        "--model",
        dest="models",
        action="append",
        default=[],
        metavar="VERSION=MODEL.kiln",
        help="repeatable: versions side by side",
    )
    s.add_argument(
        "--split", action="append", default=[], metavar="VERSION=FRACTION", help="canary traffic share, e.g. v2=0.05"
    )
    s.add_argument("--name", default=None, help="served model name (default: the first artifact's file stem)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080, help="0: any free port")
    s.add_argument(
        "--max-batch", type=int, default=8, help="most requests per batch (capped by the largest batch bucket)"
    )
    s.add_argument(
        "--max-wait-ms", type=float, default=5.0, help="how long the first request of a batch waits for more"
    )
    s.add_argument("--queue", type=int, default=64, help="bounded queue per version; full -> 503 with Retry-After")
    s.add_argument("--timeout-ms", type=float, default=1000.0, help="per request; late -> 504")
    s.add_argument("--workers", type=int, default=1, help="server processes sharing the port")
    s.add_argument(
        "--threads", type=int, default=None, help="TVM threads per worker (default: (cores - 1) / workers, at least 1)"
    )
    s.add_argument("--max-body-mb", type=float, default=64.0, help="larger bodies -> 413")
    s.add_argument("--no-warmup", action="store_true", help="do not run each bucket once before reporting ready")
    s.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    s.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="PUBLIC.pem",
        help="refuse the artifact unless one of these keys signed it (repeatable)",
    )
    s.set_defaults(fn=_serve)
    u = sub.add_parser(
        "unpack", help="verify an artifact and write its members into a folder (for the C++ runner kiln_run)"
    )
    u.add_argument("model", metavar="MODEL.kiln")
    u.add_argument("directory", metavar="DIR")
    u.add_argument(
        "--trusted-key", action="append", default=[], metavar="PUBLIC.pem", help="refuse it unless signed by this key"
    )
    u.set_defaults(fn=_unpack)
    k = sub.add_parser("keygen", help="make an Ed25519 key pair for signing artifacts")
    k.add_argument("private", metavar="PRIVATE")
    k.add_argument("public", metavar="PUBLIC")
    k.set_defaults(fn=_keygen)
    g = sub.add_parser("sign", help="sign an artifact's manifest (kiln run/bench/serve --trusted-key check it)")
    g.add_argument("model", metavar="MODEL.kiln")
    g.add_argument("--key", required=True, metavar="PRIVATE")
    g.set_defaults(fn=_sign)
    i = sub.add_parser("inspect", help="describe an .onnx model or a .kiln artifact, and/or a --target's capabilities")
    i.add_argument("model", nargs="?", default=None, help="optional with --target: then only the target is described")
    i.add_argument("--json", action="store_true")
    i.add_argument(
        "--passes", action="store_true", help="run the pipeline (no build) and print the optimization report"
    )
    _pipeline_flags(i)
    i.set_defaults(fn=_inspect)
    return p


def _print_kiln_warnings(cmd: str) -> None:
    """Kiln's warnings (a pass skipped, a constant left unfolded) as one line each on stderr."""
    import warnings

    from .errors import KilnWarning

    shown = warnings.showwarning
    if getattr(shown, "kiln", False):  # main() called again in one process
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, KilnWarning):
            print(f"kiln {cmd}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    show.kiln = True
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    _print_kiln_warnings(args.cmd)
    try:
        return args.fn(args)
    except KilnError as e:
        if args.debug:
            traceback.print_exc()
        code = getattr(e, "exit_code", 2)  # 1 for an InternalError: Kiln's bug, not the user's
        print(f"kiln {args.cmd}: {'error' if code == 2 else 'internal error'}: {e}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print(f"kiln {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in Kiln or TVM: say so, keep the trace behind --debug
        if args.debug:
            traceback.print_exc()
        print(
            f"kiln {args.cmd}: internal error: {type(e).__name__}: {e} (rerun with --debug and report it)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
