"""What Kiln's graph passes buy: each zoo model at --opt-level 0 (lowering only) and 2 (default),
timed in the same process, interleaved, median of N. Run by hand:
    .venv/bin/python benchmarks/passes.py [--models resnet18,mobilenet_v2] [--repeat 5]"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import kiln
from kiln import zoo


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,mobilenet_v2,transformer_encoder")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp())
    print("| model | kernels O0 | kernels O2 | O0 ms | O2 ms | speed-up | planned MB O0 | planned MB O2 |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        build, shape = zoo.MODELS[name]
        model = build()
        runs = {}
        for level in (0, 2):
            r = kiln.compile(model, tmp / f"{name}{level}.kiln", input_shapes=[shape], opt_level=level)
            runs[level] = (kiln.load(tmp / f"{name}{level}.kiln"), r.report)
        m = runs[0][0]
        x = {m.inputs[0].name: np.random.default_rng(0).standard_normal(m.inputs[0].shape).astype(np.float32)}
        ts = {0: [], 2: []}
        for mm, _ in runs.values():
            mm.run(x)
        for _ in range(a.repeat):
            for level, (mm, _) in runs.items():
                t = time.perf_counter()
                mm.run(x)
                ts[level].append((time.perf_counter() - t) * 1e3)
        med = {k: statistics.median(v) for k, v in ts.items()}
        r0, r2 = runs[0][1], runs[2][1]
        print(
            f"| {name} | {r0['kernels']} | {r2['kernels']} | {med[0]:.1f} | {med[2]:.1f} | {med[0] / med[2]:.2f}x | "
            f"{r0['activation_bytes_planned'] / 1e6:.1f} | {r2['activation_bytes_planned'] / 1e6:.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
