"""`kiln bench` and `kiln profile`: latency of a whole artifact, and of each of its kernels."""

from __future__ import annotations

import json

from .flags import add_options, check_writable, given, output_flags, require, trusted_key, trusted_keys

ORDER = 30
COMMANDS = {
    "bench": "latency percentiles, QPS, cold start and peak RSS (optionally beside onnxruntime)",
    "profile": "time every kernel: source ONNX ops, ms, share, GFLOP/s and % of this CPU's peak, bytes, "
    "tuned or default",
}


def _check_outputs(a) -> None:
    """Everything the flags need, checked before the first run: optional packages and output folders."""
    if a.plot:
        require("matplotlib", "bench", "--plot")
    if getattr(a, "onnx", None):
        require("onnxruntime", "bench", "--onnx")
    check_writable(a.json, "--json")
    check_writable(a.plot, "--plot")


def _bench(a) -> int:
    from .._io import atomic_write_text
    from ..runtime.bench import BenchOptions, bench, format_bench

    opts = BenchOptions(**given(BenchOptions, a), trusted_keys=trusted_keys(a))
    _check_outputs(a)
    r = bench(a.model, opts)
    print(format_bench(r))
    if a.profile:
        from ..runtime.profile import ProfileOptions, format_profile, plot_profile, profile

        popts = ProfileOptions(
            threads=opts.threads,
            warmup=opts.warmup,
            repeat=min(opts.repeat or 50, 200),
            inputs=opts.inputs,
            trusted_keys=opts.trusted_keys,
        )
        r["profile"] = profile(a.model, popts)
        print(format_profile(r["profile"]))
    if a.json:
        atomic_write_text(a.json, json.dumps(r, indent=2))
    if a.plot:
        from ..runtime.plot import latency_histogram

        latency_histogram(r, a.plot)
        if a.profile:  # the kernels' chart beside the histogram: OUT.png -> OUT.kernels.png
            plot_profile(r["profile"], (a.plot[:-4] if a.plot.endswith(".png") else a.plot) + ".kernels.png")
    return 0


def _profile(a) -> int:
    from .._io import atomic_write_text
    from ..runtime.profile import ProfileOptions, format_profile, plot_profile, profile

    opts = ProfileOptions(**given(ProfileOptions, a), trusted_keys=trusted_keys(a))
    _check_outputs(a)
    p = profile(a.model, opts)
    print(format_profile(p))
    if a.json:
        atomic_write_text(a.json, json.dumps(p, indent=2))
    if a.plot:
        plot_profile(p, a.plot)
    return 0


def register(sub) -> None:
    from ..runtime.bench import BenchOptions
    from ..runtime.profile import ProfileOptions

    b = sub.add_parser("bench", help=COMMANDS["bench"])
    b.add_argument("model")
    add_options(b, BenchOptions, "onnx", "inputs", "threads", "warmup")
    add_options(b.add_mutually_exclusive_group(), BenchOptions, "repeat", "seconds")
    output_flags(b, "latency histogram; with --profile also the kernels' chart, OUT.kernels.png")
    b.add_argument(
        "--profile", action="store_true", help="then time every kernel (see kiln profile); in --json as 'profile'"
    )
    trusted_key(b)
    b.set_defaults(fn=_bench)
    f = sub.add_parser("profile", help=COMMANDS["profile"].replace("%", "%%"))
    f.add_argument("model")
    add_options(f, ProfileOptions, "inputs", "threads", "warmup", "repeat", "top")
    output_flags(f, "bar chart of the kernels' times")
    trusted_key(f)
    f.set_defaults(fn=_profile)
