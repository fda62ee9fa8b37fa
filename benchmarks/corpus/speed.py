"""Times the corpus artifacts run.py compiled, on a quiet machine: Kiln / onnxruntime p50 and each
engine's p99/p50, from `kiln bench --onnx --inputs` (alternating blocks, warm-up first, one process
per model), and the geometric mean over the models that pass.

run.py compiles, checks and times each model, but its timings are only as good as the machine was
quiet during a long run (benchmarks/tail.md: a worker of TVM's pool that loses its core stalls every
parallel-for, so a shared machine inflates Kiln's latency far more than onnxruntime's). This script
re-times the artifacts already built, in one short pass, so the ratio table can be taken when nothing
else runs; it refuses to start when the 1-minute load average is above --max-load.

    .venv/bin/python benchmarks/corpus/speed.py [--seconds 10] [--only a,b] [--out benchmarks/corpus_speed]
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from timing import ROOT, corpus_arguments, passing, quiet_enough, run_meta, save, table_rows

KEYS = ("p50_ms", "ort_p50_ms", "ratio_p50", "p99_over_p50", "ort_p99_over_p50", "max_ms", "runs_preempted", "runs")


def bench(art: Path, onnx_path: Path, inputs: Path, seconds: float, out: Path) -> dict:
    cmd = [str(ROOT / ".venv/bin/kiln"), "bench", str(art), "--onnx", str(onnx_path), "--inputs", str(inputs)]
    cmd += ["--seconds", str(seconds), "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    d = json.loads(out.read_text())
    return {k: d.get(k) for k in KEYS}


def earlier(meta: dict) -> list:
    """The lines that say which rows a --merge run kept from an earlier one."""
    if "earlier" not in meta:
        return []
    return [
        f"Only the --only models were re-timed in that run; the others come from earlier runs: {meta['earlier']}.",
        "",
    ]


def _cells(r: dict) -> list[str]:
    keys = ("p50_ms", "ort_p50_ms", "ratio_p50", "p99_over_p50", "ort_p99_over_p50", "max_ms")
    return [f"{r[k]:.3f}" if k.endswith("p50_ms") else f"{r[k]:.2f}" for k in keys] + [str(r["runs"])]


def write(out: Path, rows: dict, meta: dict) -> None:
    ok = {m: r for m, r in rows.items() if r.get("ratio_p50")}
    geo = math.exp(sum(math.log(r["ratio_p50"]) for r in ok.values()) / len(ok)) if ok else float("nan")
    over = sorted(m for m, r in ok.items() if r["ratio_p50"] > 1.2)
    tails = sorted(m for m, r in ok.items() if (r["p99_over_p50"] or 0) > 1.5)
    lines = [
        f"# Corpus speed: Kiln / onnxruntime on {meta['cpu']}",
        "",
        f"Command: `{meta['command']}`; {meta['started']}; Kiln at {meta['kiln']}; load average at the start "
        f"{meta['load']}. Artifacts: the ones benchmarks/corpus/run.py compiled (default options). 2 threads each.",
        "",
        *earlier(meta),
        f"**Geometric mean Kiln/onnxruntime p50 over {len(ok)} models: {geo:.2f}x**; above 1.2x: {len(over)} "
        f"({', '.join(over) or 'none'}); Kiln p99 over 1.5x p50: {len(tails)} ({', '.join(tails) or 'none'}).",
        "",
        "| model | kiln p50 ms | ort p50 ms | ratio | kiln p99/p50 | ort p99/p50 | kiln max ms | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += table_rows(rows, _cells, 8)
    save(out, lines, meta, rows)


def main(argv=None) -> int:
    ap = corpus_arguments(__doc__, "corpus_speed", seconds=10.0)
    ap.add_argument("--merge", action="store_true", help="with --only: keep OUT.json's other rows (their run is named)")
    a = ap.parse_args(argv)
    load = quiet_enough(a.max_load, "timings")
    if load is None:
        return 2
    corpus, only = Path(a.corpus), set(filter(None, a.only.split(",")))
    meta = run_meta("speed.py", argv, load)
    rows: dict = {}
    old = Path(a.out).with_suffix(".json")
    if a.merge and only and old.exists():
        before = json.loads(old.read_text())
        rows = {m: r for m, r in before["rows"].items() if m not in only}
        b = before["meta"]
        first = f"`{b['command']}` at {b['kiln']}, {b['started']}"
        meta["earlier"] = f"{b['earlier']}; {b['started']} at {b['kiln']}" if "earlier" in b else first
    tmp = Path(a.out).with_suffix(".tmp.json")
    for name, art in passing(corpus, only):
        rows[name] = bench(art, corpus / f"{name}.onnx", corpus / f"{name}.inputs.npz", a.seconds, tmp)
        print(json.dumps({"model": name, **rows[name]}), file=sys.stderr, flush=True)
        order = {m: i for i, (m, _) in enumerate(passing(corpus, set()))}
        write(Path(a.out), dict(sorted(rows.items(), key=lambda kv: order.get(kv[0], len(order)))), meta)
    tmp.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
