"""`kiln bench` and `kiln profile`: latency of a whole artifact, and of each of its kernels."""

from __future__ import annotations

import json

from .flags import threads, trusted_key, trusted_keys

ORDER = 30


def _bench(a) -> int:
    from .._io import atomic_write_text
    from ..runtime.bench import BenchOptions, bench, format_bench

    if a.plot:
        from ..runtime.profile import check_plot

        check_plot()  # before any run
    r = bench(
        a.model,
        BenchOptions(
            threads=a.threads,
            warmup=a.warmup,
            repeat=a.repeat,
            seconds=a.seconds,
            onnx=a.onnx,
            trusted_keys=trusted_keys(a),
        ),
    )
    print(format_bench(r))
    if a.profile:
        from ..runtime.profile import ProfileOptions, format_profile, plot_profile, profile

        popts = ProfileOptions(
            threads=a.threads, warmup=a.warmup, repeat=min(a.repeat or 50, 200), trusted_keys=trusted_keys(a)
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
    from ..runtime.profile import ProfileOptions, check_plot, format_profile, plot_profile, profile

    if a.plot:
        check_plot()  # before any run
    p = profile(
        a.model,
        ProfileOptions(threads=a.threads, warmup=a.warmup, repeat=a.repeat, top=a.top, trusted_keys=trusted_keys(a)),
    )
    print(format_profile(p))
    if a.json:
        atomic_write_text(a.json, json.dumps(p, indent=2))
    if a.plot:
        plot_profile(p, a.plot)
    return 0


def register(sub) -> None:
    b = sub.add_parser(
        "bench", help="latency percentiles, QPS, cold start and peak RSS (optionally beside onnxruntime)"
    )
    b.add_argument("model")
    b.add_argument(
        "--onnx", default=None, metavar="MODEL.onnx", help="also run onnxruntime on the same input, alternating"
    )
    threads(b)
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
    trusted_key(b)
    b.set_defaults(fn=_bench)
    f = sub.add_parser(
        "profile",
        help="time every kernel: source ONNX ops, ms, share, GFLOP/s and %% of this CPU's "
        "peak, bytes, tuned or default",
    )
    f.add_argument("model")
    threads(f)
    f.add_argument("--warmup", type=int, default=5)
    f.add_argument(
        "--repeat", type=int, default=50, help="profiled runs (as many plain runs alternate, for the latency)"
    )
    f.add_argument("--top", type=int, default=15, help="kernels in the table (--json has all)")
    f.add_argument("--json", default=None, metavar="OUT.json")
    f.add_argument("--plot", default=None, metavar="OUT.png", help="bar chart of the kernels' times (needs matplotlib)")
    trusted_key(f)
    f.set_defaults(fn=_profile)
