"""Zoo ResNet-18 (224x224) and MobileNetV2 on the simulated VTA-compatible accelerator, end to end,
default heuristic vs `kiln tune`. Run by hand:
    nice -n 19 .venv/bin/python benchmarks/vta.py [--boards sim,ultra96] [--budget 10m] [--db DIR]
Per board: `kiln tune --target "vta-sim -board=B" --quantize int8 --calibration C --budget T`
(skipped for a board whose records are already in --db with --no-tune), then compiles with
--tuning-db, runs one input on the simulator and on the numpy reference of the same integer
arithmetic (must be bit-exact) and compares with onnxruntime fp32 (8 random-normal calibration
samples: the zoo models have random weights). Cycle counts are the simulator's (deterministic,
load on the machine does not change them); wall times are of this noisy 2-core machine.
Published pipelined 1x16x16 (tsim, apache/tvm-vta PR #30): 7,729,601 cycles for ResNet-18.
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
from kiln.cli import main as kiln_main

PUBLISHED = 7_729_601


def _cos(a, b) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def run_board(path: Path, calib: Path, x: np.ndarray, ref_fp32, target: str, db: Path, budget: str, tune: bool):
    t = time.perf_counter()
    if tune:
        args = ["tune", str(path), "--target", target, "--quantize", "int8", "--calibration", str(calib)]
        assert kiln_main([*args, "--db", str(db), "--budget", budget]) == 0
    tune_s = time.perf_counter() - t
    out_path = path.with_name(f"{path.stem}_{target.replace(' ', '_').replace('=', '-')}.kiln")
    t = time.perf_counter()
    r = kiln.compile(path, out_path, target=target, quantize="int8", calibration=calib, tuning_db=str(db))
    compile_s = time.perf_counter() - t
    v = r.report["vta"]
    m = kiln.load(out_path)
    t = time.perf_counter()
    out = m.run({"input": x})["output"]
    sim_s = time.perf_counter() - t
    ref = kiln.load(out_path, accelerator="reference").run({"input": x})["output"]
    keys = ("offloaded", "not_offloaded", "sim_cycles_total", "sim_cycles_default_schedules", "sim_gemm_cycles")
    return {
        **{k: v[k] for k in keys + ("gops", "utilization", "config", "layers")},
        "tune_wall_s": round(tune_s, 1),
        "compile_wall_s": round(compile_s, 1),
        "sim_wall_s": round(sim_s, 1),
        "bit_exact_vs_reference": bool(np.array_equal(out, ref)),
        "cosine_vs_ort_fp32": _cos(out, ref_fp32),
        "top1_same_as_ort_fp32": bool(out.argmax() == ref_fp32.argmax()),
    }


def per_layer(d: dict) -> list[str]:
    rows = []
    for lay in d["layers"]:
        s, ld, st = lay["schedule"], lay["dram_bytes"]["load"], lay["stall"]
        rows.append(
            [
                lay["layer"],
                lay["default_cycles"],
                lay["cycles"],
                lay["gemm_cycles"],
                f"{lay['utilization'] * 100:.0f}%",
                f"{s['tco']}x{s['th']}x{s['tci']} {s['order']}{' db' if s['double'] else ''}",
                f"{ld['inp'] / 1e3:.0f}/{ld['wgt'] / 1e3:.0f}/{(ld['acc'] + ld['uop']) / 1e3:.1f}",
                f"{lay['dram_bytes']['store'] / 1e3:.0f}",
                f"{st['load']}/{st['compute']}/{st['store']}",
                "residual add" if lay["residual_on_alu"] else "",
                lay["int8_input_from"] or "CPU",
            ]
        )
    head = [
        "layer",
        "default cycles",
        "tuned cycles",
        "GEMM cycles",
        "GEMM util.",
        "schedule tco x th x tci",
        "DMA load kB inp/wgt/acc+uop",
        "store kB",
        "stall cycles load/compute/store",
        "ALU epilogue",
        "int8 input from",
    ]
    return table(head, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boards", default="sim,ultra96")
    ap.add_argument("--budget", default="10m")
    ap.add_argument("--db", default=None, help="tuning database root (default: a fresh temporary folder)")
    ap.add_argument("--no-tune", action="store_true", help="use the records already in --db")
    ap.add_argument("--out", default="benchmarks/vta")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kiln-vta-"))
    db = Path(a.db) if a.db else tmp / "db"
    rng = np.random.default_rng(0)
    np.savez(tmp / "calib.npz", input=rng.standard_normal((8, 3, 224, 224)).astype(np.float32))
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    import onnxruntime as ort

    data, lines = {}, []
    nets = [("resnet18", zoo.resnet18(), a.boards.split(",")), ("mobilenet_v2", zoo.mobilenet_v2(), ["sim"])]
    for net, model, boards in nets:
        onnx.save(model, tmp / f"{net}.onnx")
        sess = ort.InferenceSession(str(tmp / f"{net}.onnx"), providers=["CPUExecutionProvider"])
        ref_fp32 = sess.run(None, {"input": x})[0]
        for board in boards:
            target = f"vta-sim -board={board}"
            d = run_board(tmp / f"{net}.onnx", tmp / "calib.npz", x, ref_fp32, target, db, a.budget, not a.no_tune)
            data[f"{net}/{board}"] = d
            print(net, board, d["sim_cycles_default_schedules"], d["sim_cycles_total"], file=sys.stderr, flush=True)
    rows = [
        [
            key,
            f"{d['config']['clock_mhz']:.0f} MHz / {d['config']['axi_bytes'] * 8}-bit",
            f"{len(d['offloaded'])} of {len(d['offloaded']) + len(d['not_offloaded'])}",
            f"{d['sim_cycles_default_schedules'] / 1e6:.3f} M",
            f"{d['sim_cycles_total'] / 1e6:.3f} M",
            f"{d['sim_gemm_cycles'] / 1e6:.3f} M",
            f"{d['sim_cycles_total'] / PUBLISHED:.3f}x" if key.startswith("resnet18") else "",
            f"{d['utilization'] * 100:.1f}%",
            f"{d['gops']:.1f}",
            d["bit_exact_vs_reference"],
            f"{d['cosine_vs_ort_fp32']:.5f}",
            d["top1_same_as_ort_fp32"],
            f"{d['tune_wall_s']:.0f} s",
        ]
        for key, d in data.items()
    ]
    first = next(iter(data.values()))
    lines += [
        f"Zoo models, 224x224, on the simulated VTA ({first['config']['name']}); published ResNet-18 on the "
        f"pipelined 1x16x16 core (tsim): {PUBLISHED / 1e6:.2f} M cycles. `kiln tune --budget {a.budget}` per board "
        "(the search exhausts each layer's schedule space well inside it); cycles are the simulator's, "
        "deterministic; wall times are of this shared 2-core machine.",
        "",
    ]
    lines += table(
        [
            "model/board",
            "clock / AXI",
            "layers offloaded",
            "cycles, default heuristic",
            "cycles, tuned",
            "GEMM cycles",
            "tuned vs published",
            "MAC utilization",
            "GOPS",
            "bit-exact vs reference",
            "cosine vs ORT fp32",
            "top-1 = ORT",
            "tune wall time",
        ],
        rows,
    )
    for key, d in data.items():
        lines += ["", f"### {key}: per layer", ""]
        lines += per_layer(d)
        lines += ["", "Not offloaded: " + "; ".join(f"{k}: {v}" for k, v in d["not_offloaded"].items())]
    save(a.out, data, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
