"""Which shipped tuning records (tuning_logs/<target key>/) a compile may use, decided by capabilities.

MetaSchedule's database is not target-aware: it replays any record whose workload matches, so the
choice of folder is the only guard. A folder is keyed by the exact target it was tuned for (kind,
CPU, hash of the whole target), and an exact key match is used as it is. Otherwise a set applies to
a target whose capabilities make its schedules valid and their tuning meaningful: the same
architecture, vector width, register file, float32 block, int8 kernel family and bf16 instruction,
and every ISA feature the set's code may use present on the target (a Zen 5 compile takes the Zen 4
records: its AVX-512 is a superset). Anything else (an AVX2 target and AVX-512 records) gets none,
and `describe` says why, for the report."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ...target import Target
from .database import FILES, target_key

MATCHED_FIELDS = ("arch", "isa", "vector_bits", "vector_registers", "f32_block", "int8_path", "bf16")


@dataclasses.dataclass(frozen=True)
class ShippedSet:
    path: Path
    target: Target  # the target its records were tuned for (from the records themselves)


def shipped_sets(root: Path) -> list[ShippedSet]:
    """The complete record folders under root, with the target read from their first record."""
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if not all((d / f).exists() for f in FILES):
            continue
        t = _tuned_for(d)
        if t is not None:
            out.append(ShippedSet(d, t))
    return out


def _tuned_for(d: Path) -> Target | None:
    with open(d / FILES[1]) as f:
        line = f.readline()
    try:
        td = json.loads(line)[1][2]
    except (ValueError, IndexError, KeyError, TypeError):
        return None
    if not isinstance(td, dict) or td.get("kind") != "llvm":
        return None
    parts = ["llvm"] + [f"-{k}={td[k]}" for k in ("mcpu", "mtriple") if td.get(k)]
    if td.get("mattr"):
        parts.append("-mattr=" + ",".join(td["mattr"]))
    try:
        return Target.parse(" ".join(parts))
    except Exception:  # a CPU this LLVM does not know: the set cannot apply
        return None


def mismatch(tuned: Target, target: Target) -> str | None:
    """Why records tuned for `tuned` do not apply to `target` (None: they do)."""
    a, b = tuned.caps, target.caps
    for field in MATCHED_FIELDS:
        if getattr(a, field) != getattr(b, field):
            return f"{field} {getattr(a, field)} there, {getattr(b, field)} here"
    missing = sorted(set(a.isa_features) - set(b.isa_features))
    return f"needs {', '.join(missing)}" if missing else None


def select(root: Path | None, target: Target) -> tuple[Path | None, str]:
    """(the folder to use or None, the sentence the report carries)."""
    if root is None:
        return None, "shipped records disabled (KILN_TUNING_LOGS=none)"
    if target.kind != "llvm":  # the backends of other kinds (and accelerators) never ask
        return None, f"no shipped records for {target.kind} targets"
    sets = shipped_sets(root)
    exact = root / target_key(target)
    for s in sets:
        if s.path == exact:
            return s.path, f"shipped set {s.path.name} (tuned for exactly this target)"
    why = []
    fits = []
    for s in sets:
        m = mismatch(s.target, target)
        if m is None:
            fits.append(s)
        else:
            why.append(f"{s.path.name}: {m}")
    if fits:
        best = max(fits, key=lambda s: len(s.target.caps.isa_features))
        return best.path, (
            f"shipped set {best.path.name} (tuned for {best.target.caps.cpu}; this target's capabilities match "
            "and include every feature its code uses)"
        )
    if not sets:
        return None, f"no shipped records in {root}"
    return None, "no shipped set matches this target's capabilities (" + "; ".join(why) + ")"


def describe(tuning_db: str | None, target: Target, root: Path | None) -> str:
    """The report's `tuning_records`: which records the compile applied, or why none."""
    if tuning_db is None:
        return select(root, target)[1]
    p = Path(tuning_db)
    if root is not None and p.parent == root:
        return select(root, target)[1]
    return f"records from {tuning_db} (given with --tuning-db)"
