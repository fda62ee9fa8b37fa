"""What every benchmark script ends with: the raw rows as JSON and a markdown table, both written
atomically beside each other (OUT.json, OUT.md), the table also printed."""

from __future__ import annotations

import json
from pathlib import Path

from kiln._io import atomic_write_text


def table(header: list[str], rows: list[list]) -> list[str]:
    """Markdown table lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(str(c) for c in r) + " |" for r in rows
    ]


def save(out: str | Path, data, lines: list[str]) -> None:
    out = Path(out)
    atomic_write_text(out.with_suffix(".json"), json.dumps(data, indent=2))
    atomic_write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
