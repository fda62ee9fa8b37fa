"""Which layout wins on which zoo model, on this host: compile each model in each layout, time it
(warm-up, then the median of N runs, layouts interleaved so drift hits all), and print a markdown
table. Run by hand:  .venv/bin/python benchmarks/layout.py [--repeat 7] [--models resnet18,...]"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import kiln
from kiln import zoo
from kiln.compiler.passes.convert_layout import LAYOUTS
from kiln.runtime.hostinfo import physical_cores


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,mobilenet_v2,resnet50")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kiln-layout-"))
    rows, cpu = [], kiln.target.Target.parse(None).mcpu
    for name in a.models.split(","):
        build, shape = zoo.MODELS[name]
        model = build()
        loaded = {}
        for layout in LAYOUTS:
            t = time.perf_counter()
            kiln.compile(model, tmp / f"{name}-{layout}.kiln", input_shapes=[shape], layout=layout)
            loaded[layout] = (kiln.load(tmp / f"{name}-{layout}.kiln"), time.perf_counter() - t)
        m0 = loaded[LAYOUTS[0]][0]
        x = {m0.inputs[0].name: np.random.default_rng(0).standard_normal(m0.inputs[0].shape).astype(np.float32)}
        times = {layout: [] for layout in LAYOUTS}
        for m, _ in loaded.values():
            m.run(x)  # warm-up
        for _ in range(a.repeat):
            for layout, (m, _) in loaded.items():
                t = time.perf_counter()
                m.run(x)
                times[layout].append((time.perf_counter() - t) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            {
                "model": name,
                **{f"{k}_ms": round(v, 2) for k, v in med.items()},
                **{f"{k}_compile_s": round(loaded[k][1], 1) for k in LAYOUTS},
                "winner": min(med, key=med.get),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)
    print(
        f"Layout, untuned default schedules, batch 1, {physical_cores()} threads, -mcpu={cpu}, median of {a.repeat}\n"
    )
    print("| model | " + " | ".join(f"{k} ms" for k in LAYOUTS) + " | winner |")
    print("|---|" + "---|" * (len(LAYOUTS) + 1))
    for r in rows:
        print(f"| {r['model']} | " + " | ".join(f"{r[k + '_ms']:.1f}" for k in LAYOUTS) + f" | {r['winner']} |")
    if a.json:
        from kiln._io import atomic_write_text

        atomic_write_text(a.json, json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
