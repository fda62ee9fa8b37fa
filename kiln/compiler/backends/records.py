"""Tuning-record selection for the backends whose kernels MetaSchedule tunes: `--tuning-db` resolved
to the folder a compile applies, and the report's sentence saying which records it applied."""

from __future__ import annotations

from pathlib import Path

from ...env import SHIPPED_TUNING_LOGS, TUNING_LOGS, shipped_tuning_logs
from ...errors import OptionsError

__all__ = ["SHIPPED_TUNING_LOGS", "TUNING_LOGS", "metaschedule_db", "no_shipped_records", "shipped_tuning_logs"]


def metaschedule_db(path, target, shipped: bool = True) -> str | None:
    """A tuning database root (holding one folder per target key) or a target's folder itself.
    None (the default): with `shipped`, the records Kiln ships in tuning_logs/ for this target or one whose
    capabilities match (schedules/tuning/shipped.py), so a compile on a machine whose records ship gets tuned
    kernels with no tuning run; "none": no database. A root without this target's folder is an error
    naming the key."""
    from ...schedules.tuning.database import FILES, target_key

    if path is None:
        root = shipped_tuning_logs() if shipped else None
        if root is None:
            return None
        from ...schedules.tuning.shipped import select

        chosen, _why = select(root, target)  # by capabilities; the report says which, or why none
        return None if chosen is None else str(chosen)
    if str(path).lower() == "none":
        return None
    p = Path(path)
    if (p / FILES[0]).exists():
        return str(p)
    if (p / target_key(target) / FILES[0]).exists():
        return str(p / target_key(target))
    raise OptionsError(
        f"no tuning records for target {str(target)!r} in {p}",
        where=str(p),
        fix=f"run `kiln tune ... --db {p}` first (records live in {p}/{target_key(target)}/), or pass --tuning-db none",
    )


def no_shipped_records(tuning_db: str | None, target, root: Path | None) -> str:
    """The report's `tuning_records` for a target kind Kiln ships no records for."""
    if tuning_db is not None and (root is None or Path(tuning_db).parent != root):
        return f"records from {tuning_db} (given with --tuning-db)"
    if root is None:
        return "shipped records disabled (KILN_TUNING_LOGS=none)"
    return f"no shipped records for {target.kind} targets"
