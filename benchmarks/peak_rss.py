"""Peak resident memory of one model in Kiln and in onnxruntime, each engine alone in a fresh process (load,
then 3 runs on the model's seeded input), as /proc/self/status's VmHWM reports it at the end
(ru_maxrss would not do: Linux copies it from the parent into the child).

Fused attention writes no S x S scores: Whisper's encoder (1500 tokens, 6 or 8 heads) held 54-72 MB of them
per layer unfused. This compares the whole process's peak, imports included, so it is what a user sees.

    .venv/bin/python benchmarks/peak_rss.py build/transformers/whisper_tiny_enc.onnx [...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import sys, numpy as np
engine, src, art, npz = sys.argv[1:5]
feed = dict(np.load(npz))
if engine == "kiln":
    import kiln
    m = kiln.load(art, num_threads=2)
    run = lambda: m.run(feed)
else:
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = 2
    s = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    run = lambda: s.run(None, feed)
for _ in range(3):
    run()
# VmHWM: this address space's peak (ru_maxrss is inherited from the parent across fork and exec on Linux)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(int(hwm.split()[1]) / 1024)
"""


def peak(engine: str, src: Path, art: Path, npz: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, engine, str(src), str(art), str(npz)], capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    import kiln

    rows = {}
    for src in map(Path, argv or sys.argv[1:]):
        npz = src.with_name(src.stem + ".inputs.npz")
        with tempfile.TemporaryDirectory() as tmp:
            art = Path(tmp) / "m.kiln"
            kiln.compile(src, art)
            rows[src.stem] = {
                "kiln_mb": round(peak("kiln", src, art, npz), 1),
                "ort_mb": round(peak("ort", src, art, npz), 1),
            }
        print(src.stem, json.dumps(rows[src.stem]), flush=True)
    from kiln.runtime.hostinfo import cpu_model_name

    lines = [
        "# Peak resident memory, each engine alone in a fresh process (load + 3 runs)",
        "",
        f"CPU: {cpu_model_name()}; 2 threads; VmHWM. Command: `python benchmarks/peak_rss.py "
        + " ".join(argv or sys.argv[1:])
        + "`.",
        "",
        "| model | Kiln MB | onnxruntime MB |",
        "|---|---|---|",
        *(f"| {k} | {v['kiln_mb']} | {v['ort_mb']} |" for k, v in rows.items()),
    ]
    Path(__file__).with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
