"""What speed.py and tail.py share: the load check before timing, the artifacts run.py built and passed, and
the header facts of a timing run (CPU, command, time, Kiln revision, load)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from kiln.runtime.hostinfo import cpu_model_name

ROOT = Path(__file__).resolve().parents[2]


def quiet_enough(max_load: float, what: str) -> float | None:
    """The 1-minute load average, or None (said on stderr) when it is above max_load."""
    load = os.getloadavg()[0]
    if load > max_load:
        print(f"load average {load:.2f} > --max-load {max_load}: {what} would be the machine's", file=sys.stderr)
        return None
    return load


def passing(corpus: Path, only: set) -> Iterator[tuple[str, Path]]:
    """(model, artifact) for each model benchmarks/corpus.json records as passing, whose artifact exists."""
    records = json.loads((ROOT / "benchmarks" / "corpus.json").read_text())["records"]
    for r in records:
        art = corpus / "kiln" / f"{r['model']}.kiln"
        if r["status"] == "pass" and art.exists() and (not only or r["model"] in only):
            yield r["model"], art


def run_meta(script: str, argv, load: float) -> dict:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    return {
        "cpu": f"{cpu_model_name()} ({os.cpu_count()} logical CPUs)",
        "command": f"python benchmarks/corpus/{script}" + "".join(f" {x}" for x in (argv or sys.argv[1:])),
        "started": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
        "kiln": rev.strip(),
        "load": f"{load:.2f}",
    }


def corpus_arguments(doc: str, out: str, seconds: float) -> argparse.ArgumentParser:
    """The options both scripts take: the corpus, the seconds per model, a subset, the output, the load limit."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--corpus", default=str(ROOT / "build" / "corpus"))
    ap.add_argument("--seconds", type=float, default=seconds)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / out))
    ap.add_argument("--max-load", type=float, default=1.0, help="refuse to start above this 1-minute load average")
    return ap


def save(out: Path, lines: list[str], meta: dict, rows: dict) -> None:
    """OUT.md (the table) and OUT.json (meta and rows)."""
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def table_rows(rows: dict, cells, columns: int) -> list[str]:
    """A markdown row per model: `cells(row)` (the columns after the model's name), or its error."""
    out = []
    for m, r in rows.items():
        got = [f"error: {r['error']}"] + [""] * (columns - 2) if "error" in r else cells(r)
        out.append("| " + " | ".join([m, *got]) + " |")
    return out
