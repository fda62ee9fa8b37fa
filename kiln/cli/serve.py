"""`kiln serve`: the HTTP inference server with dynamic batching."""

from __future__ import annotations

import argparse

from ..errors import OptionsError
from .flags import trusted_key, trusted_keys

ORDER = 40


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
        trusted_keys=trusted_keys(a),
    )
    if a.workers > 1:
        from ..serve.workers import run_workers

        return run_workers(a.argv[a.argv.index("serve") + 1 :], a.workers, a.port, a.threads)
    from ..serve.app import serve

    serve(opts, reuse_port=a.reuse_port)
    return 0


def register(sub) -> None:
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
    trusted_key(s)
    s.set_defaults(fn=_serve)
