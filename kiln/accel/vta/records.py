"""The accelerator's tuning records: one JSON-lines file under DB/<db_key>/, keyed by the
accelerator configuration. Read by `kiln compile --tuning-db` and written by kiln/compiler/backends/vta/tune.py;
imports nothing of the compiler."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from pathlib import Path

from ..._io import atomic_write_text
from ...errors import OptionsError
from . import conv
from .config import VTAConfig

FILE = "vta_records.json"


def db_key(cfg: VTAConfig) -> str:
    """e.g. 'vta-1x16_i8w8a32_15_15_18_17-sim-3f2a9c1e' (config, board, hash of every hardware fact)."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode()).hexdigest()[:8]
    return f"vta-{cfg.name}-{cfg.board}-{digest}"


def workload_key(layer: conv.ConvLayer) -> str:
    return json.dumps(layer.workload(), sort_keys=True)


def resolve_db(path, cfg: VTAConfig) -> str | None:
    """--tuning-db for an accelerator target: a root holding DB/<db_key>/, or that folder itself;
    None or 'none': the default heuristic for every layer."""
    if path is None or str(path).lower() == "none":
        return None
    p = Path(path)
    for d in (p, p / db_key(cfg)):
        if (d / FILE).exists():
            return str(d)
    raise OptionsError(
        f"no accelerator tuning records for {cfg.name} on board {cfg.board} in {p}",
        where=str(p),
        fix=f"run `kiln tune ... --db {p}` with this target first (records live in {p}/{db_key(cfg)}/), "
        "or pass --tuning-db none",
    )


def load_records(db_dir: str | Path) -> list[dict]:
    """Every record; lines that do not parse (a write a kill interrupted) are dropped with a
    warning and the file is rewritten atomically without them."""
    p = Path(db_dir) / FILE
    if not p.exists():
        return []
    good, bad = [], []
    lines = p.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            conv.Schedule.from_json(r["schedule"])
            good.append(r)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, OptionsError):
            bad.append(i)
    if bad:
        warnings.warn(f"{p}: skipping {len(bad)} corrupt line(s) {bad[:5]} (an interrupted write)", stacklevel=2)
        atomic_write_text(p, "".join(json.dumps(r, sort_keys=True) + "\n" for r in good))
    return good


def best_schedules(records: list[dict]) -> dict[str, tuple[conv.Schedule, int]]:
    """workload key -> (its fastest schedule, cycles)."""
    best: dict = {}
    for r in records:
        if r["workload"] not in best or r["cycles"] < best[r["workload"]][1]:
            best[r["workload"]] = (conv.Schedule.from_json(r["schedule"]), int(r["cycles"]))
    return best


def compact(db_dir: str | Path) -> tuple[int, int]:
    """Keep only the best record of each workload (what a compile applies), atomically."""
    records = load_records(db_dir)
    keep = {
        w: min((r for r in records if r["workload"] == w), key=lambda r: r["cycles"])
        for w in {r["workload"] for r in records}
    }
    atomic_write_text(Path(db_dir) / FILE, "".join(json.dumps(keep[w], sort_keys=True) + "\n" for w in sorted(keep)))
    return len(records), len(keep)
