"""The tuning database: MetaSchedule's JSON database under `tuning_logs/<target key>/`. The key
names the CPU and hashes the full target, so records are only reused where they are valid.
MetaSchedule appends one JSON line per record; a kill mid-write can leave a torn last line,
which `open_database` drops with a warning (rewriting the file atomically) instead of crashing;
so are records TVM wrote but cannot read back."""

from __future__ import annotations

import functools
import hashlib
import json
import warnings
from pathlib import Path

from ..._io import atomic_write_text

FILES = ("database_workload.json", "database_tuning_record.json")
# {workload structural hash: [digests of the default-schedule traces measured for it]}: compaction drops
# a default record that a tuned one beat, and without this ledger the next run measured it again
DEFAULTS = "defaults_measured.json"
# {workload structural hash: {record trace digest: "faster" | "slower"}}: each best record measured again
# alternately with its default schedule (baseline.confirm_records); a "slower" one is never applied
CHECKED = "records_checked.json"


def target_key(target) -> str:
    """e.g. 'llvm-znver4-3f2a9c1e' (kind, CPU, hash of the whole target)."""
    d = target.to_dict()
    digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]
    return f"{d['kind']}-{d.get('mcpu') or d.get('mtriple', 'generic')}-{digest}"


def db_dir_for(root: str | Path, target) -> Path:
    return Path(root) / target_key(target)


def repair(db_dir: Path) -> int:
    """Drop lines that are not valid JSON (torn writes); returns how many were dropped."""
    dropped = 0
    for name in FILES:
        p = db_dir / name
        if not p.exists():
            continue
        good, bad = [], []
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                json.loads(line)
                good.append(line)
            except json.JSONDecodeError:
                bad.append(i)
        if bad:
            warnings.warn(f"{p}: skipping {len(bad)} corrupt line(s) {bad[:5]} (an interrupted write)", stacklevel=2)
            atomic_write_text(p, "".join(line + "\n" for line in good))
            dropped += len(bad)
    if (db_dir / FILES[1]).exists() and not (db_dir / FILES[0]).exists():
        warnings.warn(f"{db_dir}: records without their workloads; starting the database afresh", stacklevel=2)
        (db_dir / FILES[1]).unlink()
        (db_dir / DEFAULTS).unlink(missing_ok=True)
        (db_dir / CHECKED).unlink(missing_ok=True)
    return dropped


def _read_ledger(p: Path, unreadable: str) -> dict:
    """A JSON object kept beside the records ({} if none; {} and a warning saying `unreadable` if broken)."""
    try:
        d = json.loads(p.read_text()) if p.exists() else {}
    except (OSError, json.JSONDecodeError):
        d = None
    if not isinstance(d, dict):
        warnings.warn(f"{p}: unreadable; {unreadable}", stacklevel=3)
        return {}
    return d


def _write_ledger(p: Path, ledger: dict) -> None:
    atomic_write_text(p, json.dumps(ledger, sort_keys=True, indent=1) + "\n")


def measured_defaults(db_dir: str | Path) -> dict[str, list[str]]:
    """The ledger of default schedules already measured into this database ({} if none or unreadable)."""
    d = _read_ledger(Path(db_dir) / DEFAULTS, "the default schedules will be measured again")
    return {str(k): [str(x) for x in v] for k, v in d.items() if isinstance(v, list)}


def save_measured_defaults(db_dir: str | Path, ledger: dict[str, list[str]]) -> None:
    _write_ledger(Path(db_dir) / DEFAULTS, ledger)


def checked_records(db_dir: str | Path) -> dict[str, dict[str, str]]:
    """The ledger of records re-measured against their default ({} if none or unreadable)."""
    d = _read_ledger(Path(db_dir) / CHECKED, "tuned records are applied unchecked")
    return {str(k): {str(a): str(b) for a, b in v.items()} for k, v in d.items() if isinstance(v, dict)}


def save_checked_records(db_dir: str | Path, ledger: dict[str, dict[str, str]]) -> None:
    _write_ledger(Path(db_dir) / CHECKED, ledger)


def trace_digest(trace) -> str:
    """The ledger's name for a schedule: a digest of its trace's JSON."""
    return hashlib.sha256(str(trace.as_json()).encode()).hexdigest()[:16]


def best_is_default(db, db_dir: str | Path, funcs: dict) -> dict[str, bool | None]:
    """For each {name: PrimFunc}: True when the database's best record of its workload is a default
    schedule the ledger says was measured, or a record that lost to the default when both were
    measured again (CHECKED), False when it is another (it beat the default, which was measured
    first), None when the database has no record of it (or this lookup does not find one)."""
    import tvm_ffi
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    ledger, checked = measured_defaults(db_dir), checked_records(db_dir)
    out: dict[str, bool | None] = {}
    for name, func in funcs.items():
        wl = _normalize_mod(func)
        top = db.get_top_k(db.commit_workload(wl), 1) if db.has_workload(wl) else []
        if not top:
            out[name] = None
            continue
        key, digest = str(tvm_ffi.structural_hash(wl)), trace_digest(top[0].trace)
        # a record that lost to its default when both were measured again is not applied: the default is
        out[name] = digest in ledger.get(key, ()) or checked.get(key, {}).get(digest) == "slower"
    return out


def default_was_measured(db_dir: str | Path, func, default_trace, ledger: dict | None = None) -> bool:
    """Whether the ledger holds this default schedule (its trace) for the kernel's workload: a record
    that beat the default only beat *this* default if so (a rule that improved since is not in it).
    `ledger`: measured_defaults(db_dir), read once by a caller asking for many kernels."""
    import tvm_ffi
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    key = str(tvm_ffi.structural_hash(_normalize_mod(func)))
    ledger = measured_defaults(db_dir) if ledger is None else ledger
    return trace_digest(default_trace) in ledger.get(key, ())


def drop_unloadable_records(db_dir: Path) -> int:
    """Drop the records MetaSchedule wrote but cannot read back, each parsed on its own against its
    workload (seen: a ResNet-50 bf16 run wrote 9 traces of a reduction's rfactor schedule that TVM
    then refused, 'parallel_for_dynamic error', and the whole database with them); the file is
    rewritten atomically. Parsing record by record is slow, so only once the database as a whole failed to load.
    Returns how many were dropped."""
    from tvm.s_tir import meta_schedule as ms

    workloads = [
        ms.database.Workload.from_json(json.loads(line))
        for line in (db_dir / FILES[0]).read_text().splitlines()
        if line.strip()
    ]
    good, bad = [], []
    for i, line in enumerate((db_dir / FILES[1]).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            index, record = json.loads(line)
            ms.database.TuningRecord.from_json(record, workloads[index])
            good.append(line)
        except (RuntimeError, ValueError, TypeError, IndexError):  # TVM raises RuntimeError
            bad.append(i)
    if bad:
        warnings.warn(
            f"{db_dir / FILES[1]}: dropping {len(bad)} record(s) TVM cannot read back, lines {bad[:5]}", stacklevel=2
        )
        atomic_write_text(db_dir / FILES[1], "".join(line + "\n" for line in good))
    return len(bad)


def _load(db_dir: Path):
    from tvm.s_tir import meta_schedule as ms

    try:
        return ms.database.JSONDatabase(work_dir=str(db_dir), module_equality="structural")
    except RuntimeError:  # TVM's errors; which record is not said
        if not drop_unloadable_records(db_dir):
            raise
        return ms.database.JSONDatabase(work_dir=str(db_dir), module_equality="structural")


@functools.lru_cache(maxsize=4)
def _read_only_database(db_dir: str, stamp: tuple):
    return _load(Path(db_dir))


def database_for_compile(db_dir: str | Path):
    """The database a compile applies, loaded once per process while its files are unchanged
    (parsing thousands of records per compile would dominate small compiles)."""
    db_dir = Path(db_dir)
    repair(db_dir)
    stamp = tuple((db_dir / f).stat().st_mtime_ns if (db_dir / f).exists() else 0 for f in FILES)
    return _read_only_database(str(db_dir), stamp)


def open_database(db_dir: str | Path):
    db_dir = Path(db_dir)
    db_dir.mkdir(parents=True, exist_ok=True)
    repair(db_dir)
    return _load(db_dir)


def compact(db_dir: str | Path) -> tuple[int, int]:
    """Keep only the best measured record of each workload (what a compile applies; MetaSchedule's
    own pruning), rewriting the database atomically: what ships in tuning_logs/. Returns
    (records before, records after)."""
    import tempfile

    from tvm.s_tir import meta_schedule as ms

    from ..._io import atomic_write_bytes

    db_dir = Path(db_dir)
    db = open_database(db_dir)
    before = len(db.get_all_tuning_records())
    with tempfile.TemporaryDirectory(prefix="kiln-compact-") as tmp:
        out = ms.database.JSONDatabase(work_dir=tmp, module_equality="structural")
        db.dump_pruned(out)
        after = len(out.get_all_tuning_records())
        data = {name: (Path(tmp) / name).read_bytes() for name in FILES}
    for name in FILES:  # workloads first: records never point at a workload that is not there
        atomic_write_bytes(db_dir / name, data[name])
    return before, after
