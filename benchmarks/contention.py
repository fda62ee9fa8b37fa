"""Kiln's latency when another process wants a core, per thread-pool policy, beside onnxruntime.

benchmarks/tail.md found every slow run preempted. This measures the mechanism directly: the same
artifact, 2 threads, with and without one competing busy process (a Python loop at the same
priority, one core's worth), under Kiln's pool (kiln/runtime/pool.c: a descheduled worker's chunks
are taken by the caller), TVM's default pool (KILN_THREAD_POOL=tvm: one fixed share per thread, workers
spin between kernels) and TVM's with TVM_THREAD_POOL_SPIN_COUNT=0 (workers sleep at once and are
woken per kernel), onnxruntime in the same `kiln bench --onnx` process as the yardstick. Each cell
is its own process (TVM reads the variable when its pool starts); cells take turns over --rounds so
the machine's drift hits them alike.

    .venv/bin/python benchmarks/contention.py [--models bert,mobilenet_v2] [--seconds 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from kiln.runtime.hostinfo import cpu_model_name

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {
    "Kiln pool (default)": {},
    "TVM pool, spin (TVM default)": {"KILN_THREAD_POOL": "tvm"},
    "TVM pool, no spin (SPIN_COUNT=0)": {"KILN_THREAD_POOL": "tvm", "TVM_THREAD_POOL_SPIN_COUNT": "0"},
}
BUSY = "import time\nt = time.time()\nwhile time.time() - t < 600: pass\n"


def cell(model: str, env: dict, busy: bool, seconds: float) -> dict:
    corpus = ROOT / "build" / "corpus"
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "b.json"
        cmd = [str(ROOT / ".venv/bin/kiln"), "bench", str(corpus / "kiln" / f"{model}.kiln"), "--threads", "2"]
        cmd += ["--onnx", str(corpus / f"{model}.onnx"), "--inputs", str(corpus / f"{model}.inputs.npz")]
        cmd += ["--seconds", str(seconds), "--json", str(out)]
        comp = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
        try:
            subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, check=True, timeout=300)
        finally:
            if comp:
                comp.kill()
                comp.wait()
        r = json.loads(out.read_text())
    return {k: r[k] for k in ("p50_ms", "p99_ms", "ort_p50_ms", "ort_p99_ms")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,mobilenet_v2,resnet18")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "contention"))
    a = ap.parse_args(argv)
    cpu = cpu_model_name()
    load = os.getloadavg()[0]
    res: dict = {}
    for _ in range(a.rounds):
        for m in a.models.split(","):
            for busy in (False, True):
                for pol, env in POLICIES.items():
                    r = cell(m, env, busy, a.seconds)
                    res.setdefault((m, busy, pol), []).append(r)
                    print(json.dumps({"model": m, "busy": busy, "policy": pol, **r}), file=sys.stderr, flush=True)
    lines = [
        f"# Kiln under contention, per thread-pool policy ({cpu}, {os.cpu_count()} logical CPUs)",
        "",
        f"Command: `python benchmarks/contention.py {' '.join(argv or sys.argv[1:])}`; load average at the start "
        f"{load:.2f}. Median over {a.rounds} rounds of each cell's p50/p99 (ms); 2 threads; competitor: one busy "
        "Python loop at the same priority.",
        "",
        "| model | competitor | policy | kiln p50 | kiln p99 | ort p50 | ort p99 | kiln/ort p50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (m, busy, pol), rs in res.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        lines.append(
            f"| {m} | {'1 busy process' if busy else 'none'} | {pol} | {med['p50_ms']:.3f} | {med['p99_ms']:.3f} | "
            f"{med['ort_p50_ms']:.3f} | {med['ort_p99_ms']:.3f} | {med['p50_ms'] / med['ort_p50_ms']:.2f} |"
        )
    Path(a.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    Path(a.out).with_suffix(".json").write_text(json.dumps([[list(k), v] for k, v in res.items()], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
