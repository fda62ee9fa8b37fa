"""Zoo ResNet-18 (224x224) on the simulated VTA-compatible accelerator, end to end. Run by hand:
    .venv/bin/python benchmarks/vta.py [--boards sim,ultra96]
Compiles with --target "vta-sim -board=B" --quantize int8 (8 random-normal calibration samples:
the zoo model has random weights), runs one input on the simulator and on the numpy reference of
the same integer arithmetic (must be bit-exact) and compares with onnxruntime fp32; writes the
simulated cycles beside VTA's published figure for ResNet-18 on the pipelined 1x16x16 core
(7,729,601 cycles, tsim, apache/tvm-vta PR #30) and the ideal (~6.6 M GEMM cycles).
Writes benchmarks/vta.{md,json}."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from report import save, table

import kiln
from kiln import zoo

PUBLISHED = 7_729_601
IDEAL = 6.6e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boards", default="sim,ultra96")
    ap.add_argument("--out", default="benchmarks/vta")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kiln-vta-"))
    model = zoo.resnet18()
    onnx.save(model, tmp / "r18.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp / "calib.npz", input=rng.standard_normal((8, 3, 224, 224)).astype(np.float32))
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    import onnxruntime as ort

    ref_fp32 = ort.InferenceSession(str(tmp / "r18.onnx"), providers=["CPUExecutionProvider"]).run(None, {"input": x})[
        0
    ]
    rows, lines, data = [], [], {}
    for board in a.boards.split(","):
        t = time.perf_counter()
        r = kiln.compile(
            tmp / "r18.onnx",
            tmp / f"r18_{board}.kiln",
            target=f"vta-sim -board={board}",
            quantize="int8",
            calibration=tmp / "calib.npz",
        )
        compile_s = time.perf_counter() - t
        v = r.report["vta"]
        m = kiln.load(tmp / f"r18_{board}.kiln")
        t = time.perf_counter()
        out = m.run({"input": x})["output"]
        sim_s = time.perf_counter() - t
        ref = kiln.load(tmp / f"r18_{board}.kiln", accelerator="reference").run({"input": x})["output"]
        cos = float((out * ref_fp32).sum() / np.linalg.norm(out) / np.linalg.norm(ref_fp32))
        data[board] = {
            **{
                k: v[k]
                for k in (
                    "offloaded",
                    "not_offloaded",
                    "sim_cycles_total",
                    "sim_gemm_cycles",
                    "gops",
                    "utilization",
                    "config",
                )
            },
            "layers": v["layers"],
            "compile_s": round(compile_s, 1),
            "sim_wall_s": round(sim_s, 1),
            "bit_exact_vs_reference": bool(np.array_equal(out, ref)),
            "cosine_vs_ort_fp32": cos,
            "top1_same_as_ort_fp32": bool(out.argmax() == ref_fp32.argmax()),
        }
        d = data[board]
        rows.append(
            [
                board,
                f"{v['config']['clock_mhz']:.0f} MHz / {v['config']['axi_bytes'] * 8}-bit",
                len(v["offloaded"]),
                f"{v['sim_cycles_total'] / 1e6:.2f} M",
                f"{v['sim_gemm_cycles'] / 1e6:.2f} M",
                f"{v['sim_cycles_total'] / PUBLISHED:.2f}x",
                f"{v['utilization'] * 100:.1f}%",
                f"{v['gops']:.1f}",
                d["bit_exact_vs_reference"],
                f"{cos:.4f}",
                d["top1_same_as_ort_fp32"],
                f"{sim_s:.1f} s",
            ]
        )
        print(rows[-1], file=sys.stderr, flush=True)
    lines += [
        f"Zoo ResNet-18 224x224 on the simulated VTA ({data[next(iter(data))]['config']['name']}); "
        f"published pipelined 1x16x16 (tsim): {PUBLISHED / 1e6:.2f} M cycles; ideal ~{IDEAL / 1e6:.1f} M GEMM cycles.",
        "",
    ]
    lines += table(
        [
            "board",
            "clock / AXI",
            "convs offloaded",
            "sim cycles",
            "GEMM cycles",
            "vs published",
            "MAC utilization",
            "GOPS",
            "bit-exact vs reference",
            "cosine vs ORT fp32",
            "top-1 = ORT",
            "simulation wall time",
        ],
        rows,
    )
    first = data[next(iter(data))]
    lines += ["", "Per layer (first board):", ""]
    lines += table(
        [
            "layer",
            "cycles",
            "GEMM cycles",
            "utilization",
            "tile (oc blocks x rows)",
            "load busy",
            "compute busy",
            "store busy",
        ],
        [
            [
                l["layer"],
                l["cycles"],
                l["gemm_cycles"],
                f"{l['utilization'] * 100:.0f}%",
                f"{l['tiling']['tco']} x {l['tiling']['th']}",
                l["busy"]["load"],
                l["busy"]["compute"],
                l["busy"]["store"],
            ]
            for l in first["layers"]
        ],
    )
    save(a.out, data, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
