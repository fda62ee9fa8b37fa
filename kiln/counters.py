"""The optimization report's counters, declared where they are counted. Each pass class lists what it
writes into its `stats` as `COUNTERS = (Counter(name, type, meaning), ...)`; the report's own keys
(what compiler/optimize.py measures around the passes, and what the driver adds) are declared in
compiler/report.py. tests/compiler/test_report_keys.py fails on a pass writing a key its class does not
declare and on the printer reading a key nobody declares. Free of TVM and of every layer above it, so
that the schedules' passes declare theirs too."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Counter:
    name: str  # the report's key
    type: type  # int, float, list, dict or str: what the value is
    meaning: str  # what it counts, in the report's words
    always: bool = False  # in every report (0 where its pass did not run), else only once its pass runs


def declared(owner) -> dict[str, Counter]:
    """{name: Counter} of what a pass class (or instance) declares."""
    return {c.name: c for c in getattr(owner, "COUNTERS", ())}
