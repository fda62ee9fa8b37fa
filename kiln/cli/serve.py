"""`kiln serve`: the HTTP inference server with dynamic batching."""

from __future__ import annotations

import argparse

from ..errors import OptionsError
from .flags import add_options, given, trusted_key, trusted_keys

ORDER = 40
COMMANDS = {
    "serve": "inference server with dynamic batching: V1 (POST /v1/models/<name>:predict) and the Open Inference "
    "Protocol (KServe V2, HTTP and --grpc-port)"
}
SERVE_FIELDS = (
    "name",
    "host",
    "port",
    "grpc_port",
    "max_batch",
    "max_wait_ms",
    "queue",
    "timeout_ms",
    "workers",
    "threads",
    "max_body_mb",
    "warmup",
)


def _serve(a) -> int:
    from ..serve import ServeOptions

    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise OptionsError(
            "kiln serve needs aiohttp, which is not installed",
            where="kiln serve",
            fix="pip install 'kiln[serve]' (or pip install aiohttp)",
        ) from None
    if getattr(a, "grpc_port", None) is not None:
        try:
            import google.protobuf  # noqa: F401
            import grpc  # noqa: F401
        except ImportError:
            raise OptionsError(
                "--grpc-port needs grpcio and protobuf, which are not installed",
                where="--grpc-port",
                fix="pip install 'kiln[grpc]'",
            ) from None
    opts = ServeOptions.make(
        ([a.model] if a.model else []) + a.models,
        split=a.split,
        **given(ServeOptions, a),
        trusted_keys=trusted_keys(a),
    )
    if opts.workers > 1:
        from ..serve.workers import run_workers

        return run_workers(a.argv[a.argv.index("serve") + 1 :], opts.workers, opts.port, opts.threads)
    from ..serve.app import serve

    serve(opts, reuse_port=a.reuse_port)
    return 0


def register(sub) -> None:
    from ..serve.options import ServeOptions

    s = sub.add_parser("serve", help=COMMANDS["serve"])
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
    add_options(s, ServeOptions, *SERVE_FIELDS)
    s.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    trusted_key(s)
    s.set_defaults(fn=_serve)
