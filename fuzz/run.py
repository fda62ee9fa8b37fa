"""Longer fuzz runs with totals:
    .venv/bin/python -m fuzz.run [--models N] [--artifacts N] [--pt2 N] [--tflite N] [--v2 N] [--seed S]
        [--out fuzz/results]
Prints and writes the totals (cases, outcomes, distinct error kinds, findings with their cases)."""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import hypothesis
from hypothesis import HealthCheck, given, settings

from .executor import Executor
from .frontends import broken_pt2, broken_tflite
from .mutators import broken_artifacts, broken_models, set_seed_artifact
from .seeds import SEEDS
from .v2 import broken_v2

ACCEPTABLE = ("ok", "kiln_error")
STRATEGIES = {
    "model": broken_models,
    "artifact": broken_artifacts,
    "pt2": broken_pt2,
    "tflite": broken_tflite,
    "v2": broken_v2,
}


def seed_artifact() -> bytes:
    import kiln

    with tempfile.TemporaryDirectory() as d:
        kiln.compile(SEEDS["conv_net"](), Path(d) / "s.kiln")
        return (Path(d) / "s.kiln").read_bytes()


def campaign(
    kind: str, n: int, seed: int, executor: Executor, blob: bytes | None = None, raise_on_finding: bool = False
) -> dict:
    """Run n cases; returns totals. With raise_on_finding, hypothesis gets an AssertionError for a
    finding (and shrinks it): what the test suite wants."""
    totals = {"cases": 0, "outcomes": collections.Counter(), "kinds": collections.Counter(), "findings": []}
    if kind == "artifact":
        set_seed_artifact(blob)
    strategy = STRATEGIES[kind]()

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(strategy)
    def one(case):
        payload, what = (case[1], [case[0], *case[2]]) if kind == "model" else case
        r = executor.run(kind, payload)
        totals["cases"] += 1
        totals["outcomes"][r["outcome"]] += 1
        totals["kinds"][r.get("type", r["outcome"]) + ": " + _shape(r.get("detail", ""))] += 1
        if r["outcome"] not in ACCEPTABLE:
            totals["findings"].append({"case": what, **r})
            if raise_on_finding:
                raise AssertionError(
                    f"{kind} case {what}: {r['outcome']} {r.get('type', '')}: {r.get('detail')}\n"
                    f"{r.get('traceback', '')}"
                )

    hypothesis.seed(seed)(one)()
    return totals


def _shape(detail: str) -> str:
    """An error message without its variable parts: which error paths were reached."""
    import re

    text = detail.split(": ", 1)[-1] if detail.startswith("/") else detail
    return re.sub(r"\d+|'[^']*'|\"[^\"]*\"", "#", text)[:80]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=500)
    ap.add_argument("--artifacts", type=int, default=500)
    ap.add_argument("--pt2", type=int, default=200)
    ap.add_argument("--tflite", type=int, default=300)
    ap.add_argument("--v2", type=int, default=2000, help="V2 infer bodies through the server's codec")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="fuzz/results")
    a = ap.parse_args(argv)
    ex = Executor()
    report = {}
    try:
        runs = [("model", a.models, None), ("artifact", a.artifacts, seed_artifact())]
        for kind, n, blob in runs + [("pt2", a.pt2, None), ("tflite", a.tflite, None), ("v2", a.v2, None)]:
            t = time.perf_counter()
            r = campaign(kind, n, a.seed, ex, blob)
            report[kind] = {
                "cases": r["cases"],
                "seconds": round(time.perf_counter() - t, 1),
                "outcomes": dict(r["outcomes"]),
                "distinct_error_paths": len(r["kinds"]),
                "findings": r["findings"][:20],
                "error_paths": dict(r["kinds"].most_common(40)),
            }
            print(
                json.dumps({kind: {k: v for k, v in report[kind].items() if k not in ("findings", "error_paths")}}),
                flush=True,
            )
            for f in r["findings"][:5]:
                print(json.dumps(f)[:1500], flush=True)
    finally:
        ex.close()
    from kiln._io import atomic_write_text

    atomic_write_text(Path(a.out).with_suffix(".json"), json.dumps(report, indent=2))
    bad = sum(len(r["findings"]) for r in report.values())
    print(f"findings: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
