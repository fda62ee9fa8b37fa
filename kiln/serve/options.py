"""`kiln serve` options, parsed once: model versions, the canary split, batching and limits."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import OptionsError
from ..optfield import option, with_defaults


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """`kiln serve`'s options; the flagged fields are its command-line flags (kiln/cli/serve.py)."""

    models: tuple[tuple[str, str], ...]  # (version, artifact path), in order
    name: str | None = option(None, "served model name (default: the first artifact's file stem)")
    split: tuple[tuple[str, float], ...] = ()  # version -> share of traffic; the rest goes evenly to the others
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(8080, "0: any free port")
    grpc_port: int | None = option(
        None, "also serve the V2 protocol over gRPC on this port (0: any free port; the grpc extra)", type=int
    )
    max_batch: int = option(8, "most requests per batch (capped by the largest batch bucket)")
    max_wait_ms: float = option(5.0, "how long the first request of a batch waits for more")
    queue: int = option(64, "bounded queue per version; full -> 503 with Retry-After")
    timeout_ms: float = option(1000.0, "per request; late -> 504")
    workers: int = option(1, "server processes sharing the port")
    threads: int | None = option(None, "TVM threads per worker (default: (cores - 1) / workers, at least 1)", type=int)
    max_body_mb: float = option(64.0, "larger bodies -> 413")
    warmup: bool = option(True, "do not run each bucket once before reporting ready", name="--no-warmup")
    seed: int = 0
    trusted_keys: tuple | None = None  # refuse artifacts not signed by one of these (PEM paths)

    @staticmethod
    def make(models, split=(), **kw) -> ServeOptions:
        """models: ["a.kiln"] or ["v1=a.kiln", "v2=b.kiln"]; split: ["v2=0.05"]."""
        if not models:
            raise OptionsError(
                "no model to serve",
                where="kiln serve",
                fix="kiln serve MODEL.kiln, or --model v1=a.kiln --model v2=b.kiln",
            )
        parsed = []
        for i, m in enumerate(models):
            version, sep, path = str(m).partition("=")
            if not sep:
                version, path = f"v{i + 1}", m
            if not version or not path:
                raise OptionsError(
                    f"bad model spec {m!r}", where="--model", fix="write VERSION=PATH, e.g. --model v2=model-v2.kiln"
                )
            if version in dict(parsed):
                raise OptionsError(
                    f"model version {version!r} is given twice", where="--model", fix="name each version once"
                )
            if not Path(path).is_file():
                raise OptionsError(
                    f"no such artifact {path!r} (version {version})",
                    where=str(path),
                    fix="give the path of a .kiln file",
                )
            parsed.append((version, str(path)))
        shares = []
        for s in split or ():
            version, sep, frac = str(s).partition("=")
            try:
                f = float(frac)
            except ValueError:
                f = -1.0
            if not sep or version not in dict(parsed) or not 0 <= f <= 1:
                raise OptionsError(
                    f"bad --split {s!r}",
                    where="--split",
                    fix=f"write VERSION=FRACTION with a version of {[v for v, _ in parsed]} "
                    "and 0 <= FRACTION <= 1, e.g. --split v2=0.05",
                )
            shares.append((version, f))
        total = sum(f for _, f in shares)
        rest = [v for v, _ in parsed if v not in dict(shares)]
        if total > 1 + 1e-9 or (not rest and abs(total - 1) > 1e-9):
            raise OptionsError(
                f"--split shares add up to {total:g}",
                where="--split",
                fix="shares of the listed versions must add to at most 1 (exactly 1 when every version is listed)",
            )
        o = with_defaults(ServeOptions, kw, skip=("models", "split"))
        for name, lo in (("max_batch", 1), ("queue", 1), ("workers", 1), ("port", 0)):
            if int(o[name]) < lo:
                raise OptionsError(
                    f"--{name.replace('_', '-')} must be at least {lo}",
                    where=f"--{name.replace('_', '-')}",
                    fix=f"e.g. --{name.replace('_', '-')} {max(lo, 1)}",
                )
        for name, zero_ok in (("max_wait_ms", True), ("timeout_ms", False), ("max_body_mb", False)):
            value, flag = float(o[name]), f"--{name.replace('_', '-')}"
            if value < 0 or value == 0 and not zero_ok:
                raise OptionsError(f"{flag} must be positive", where=flag, fix=f"e.g. {flag} 5")
        if int(o["workers"]) > 1 and o["grpc_port"] is not None:
            raise OptionsError(
                "--grpc-port serves from one process; --workers shares only the HTTP port",
                where="--grpc-port",
                fix="drop --workers, or run one server per gRPC port",
            )
        return ServeOptions(tuple(parsed), split=tuple(shares), **o)

    @property
    def served_name(self) -> str:
        return self.name or Path(self.models[0][1]).stem

    def weights(self) -> dict[str, float]:
        """Each version's share of traffic."""
        given = dict(self.split)
        rest = [v for v, _ in self.models if v not in given]
        left = max(0.0, 1.0 - sum(given.values()))
        return {v: given.get(v, left / len(rest) if rest else 0.0) for v, _ in self.models}
