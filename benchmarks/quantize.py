"""INT8 and BF16, measured. Run by hand:  .venv/bin/python benchmarks/quantize.py [--seconds 20] [--models resnet50]
[--openvino] [--no-digits]

1. Real data: scikit-learn's digits, a small CNN trained here (benchmarks/digits_cnn.py); test-split
   accuracy of Kiln fp32, Kiln int8 (calibrated on 128 training images) and onnxruntime's int8
   (quantize_static, same calibration images).
2. Zoo models (random weights, so calibration uses random-normal inputs): p50 latency of Kiln fp32,
   int8 and bf16 against onnxruntime fp32 and onnxruntime int8 (quantize_static QDQ, per-channel,
   same calibration data), all in the same run, engines alternating in blocks (warm-up first).
   --openvino adds Kiln compiling onnxruntime's QDQ file (kiln_qdq) and OpenVINO (a benchmark dependency, never
   Kiln's; LATENCY hint, 2 threads): its default precision on the fp32 file (bf16 where the CPU has AMX or
   AVX512-BF16) and its int8 kernels on the QDQ file (issue 49's AMX rows).
Writes benchmarks/quantize.{md,json}."""

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
from kiln.runtime.bench import BLOCK_MIN_S, BLOCK_PAUSE_S


def ort_session(path, threads: int = 2):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_int8(src: Path, dst: Path, samples: list[dict]) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    return dst


def digits(tmp: Path) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from digits_cnn import DigitsCNN, load_digits_split

    (xt, yt), (xs, ys) = load_digits_split()
    net = DigitsCNN().train(xt, yt)
    src = tmp / "digits.onnx"
    onnx.save(net.to_onnx(), src)
    calib = xt[:128]
    np.savez(tmp / "digits_calib.npz", input=calib)
    kiln.compile(src, tmp / "d32.kiln")
    r = kiln.compile(src, tmp / "d8.kiln", quantize="int8", calibration=tmp / "digits_calib.npz", calib_samples=112)
    f32, i8 = kiln.load(tmp / "d32.kiln"), kiln.load(tmp / "d8.kiln")
    o8 = ort_session(ort_int8(src, tmp / "digits_ort8.onnx", [{"input": calib[i : i + 1]} for i in range(len(calib))]))
    acc = lambda f: float(np.mean([f(xs[i : i + 1]).argmax() == ys[i] for i in range(len(xs))]))
    q = r.report["quantization"]
    return {
        "test_samples": len(xs),
        "numpy_fp32": float((net.logits(xs).argmax(1) == ys).mean()),
        "kiln_fp32": acc(lambda x: f32.run({"input": x})["logits"]),
        "kiln_int8": acc(lambda x: i8.run({"input": x})["logits"]),
        "ort_int8": acc(lambda x: o8.run(None, {"input": x})[0]),
        "int8_layers": q["int8_layers"],
        "float_layers": q["float_layers"],
    }


def timed(engines: dict, seconds: float, block: int = 5) -> dict:
    """engines: name -> zero-argument run function. Warm-up, then blocks of runs per engine in turn (a pause
    between, so one engine's spinning threads do not slow the next), as `kiln bench --onnx` times them: an
    untimed run after each pause, then at least `block` runs and BLOCK_MIN_S of them. Blocks of 5 timed runs
    alone were mostly each engine's wake-up on a sub-millisecond model: isa.py's zoo transformer read 1.43 ms
    (Kiln) and 1.35 ms (onnxruntime) with them, 0.81 and 0.89 ms with these blocks (Zen 4, a day apart), and
    `kiln bench` 0.84 and 0.88 ms."""
    for f in engines.values():
        for _ in range(3):
            f()
    times = {k: [] for k in engines}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for k, f in engines.items():
            time.sleep(
                BLOCK_PAUSE_S
            )  # 0.05 s left onnxruntime's MobileNetV2 3x slower here (the other engines' spinning workers)
            f()  # untimed: wakes this engine's parked workers
            start, done = time.perf_counter(), 0
            while done < block or time.perf_counter() - start < BLOCK_MIN_S:
                t = time.perf_counter()
                f()
                times[k].append((time.perf_counter() - t) * 1e3)
                done += 1
    return {
        k: {"p50_ms": float(np.median(v)), "p90_ms": float(np.percentile(v, 90)), "runs": len(v)}
        for k, v in times.items()
    }


def ov_session(path: Path, threads: int = 2):
    """OpenVINO's compiled model at its default precision, as a user gets it, and a function running it."""
    import openvino as ov

    compiled = ov.Core().compile_model(
        str(path), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
    )
    request = compiled.create_infer_request()
    return lambda feed: (request.infer(feed), request.get_output_tensor(0).data.copy())[1]


def zoo_model(name: str, tmp: Path, seconds: float, openvino: bool = False) -> dict:
    build, shape = zoo.MODELS[name]
    src = tmp / f"{name}.onnx"
    onnx.save(build(), src)
    dims = [int(d) for d in shape.split(":")[1].split("x")]
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((16, *dims[1:])).astype(np.float32)
    np.savez(tmp / f"{name}_calib.npz", input=calib)
    arts = {}
    t = time.perf_counter()
    kiln.compile(src, tmp / f"{name}_fp32.kiln", input_shapes=[shape])
    arts["fp32_compile_s"] = time.perf_counter() - t
    t = time.perf_counter()
    r8 = kiln.compile(
        src,
        tmp / f"{name}_int8.kiln",
        input_shapes=[shape],
        quantize="int8",
        calibration=tmp / f"{name}_calib.npz",
        calib_samples=12,
    )
    arts["int8_compile_s"] = time.perf_counter() - t
    kiln.compile(src, tmp / f"{name}_bf16.kiln", input_shapes=[shape], precision="bf16")
    ort8 = ort_int8(src, tmp / f"{name}_ort8.onnx", [{"input": calib[i : i + 1]} for i in range(len(calib))])
    kinds = ("fp32", "int8", "bf16")
    if openvino:  # Kiln on onnxruntime's QDQ file: the path a user with a quantized model takes
        kiln.compile(ort8, tmp / f"{name}_qdq.kiln", input_shapes=[shape])
        kinds += ("qdq",)
    x = rng.standard_normal(dims).astype(np.float32)
    models = {k: kiln.load(tmp / f"{name}_{k}.kiln", num_threads=2) for k in kinds}
    sessions = {"ort_fp32": ort_session(src), "ort_int8": ort_session(ort8)}
    ref = sessions["ort_fp32"].run(None, {"input": x})[0]
    outs = {k: m.run({"input": x})["output"] for k, m in models.items()} | {
        k: s.run(None, {"input": x})[0] for k, s in sessions.items()
    }
    engines = {f"kiln_{k}": (lambda m=m: m.run({"input": x})) for k, m in models.items()}
    engines |= {k: (lambda s=s: s.run(None, {"input": x})) for k, s in sessions.items()}
    if openvino:
        for k, path in (("ov_default", src), ("ov_int8", ort8)):
            run = ov_session(path)
            outs[k] = run({"input": x})
            engines[k] = lambda run=run: run({"input": x})
    t = timed(engines, seconds)
    q = r8.report["quantization"]
    return {
        "model": name,
        **{k: round(v, 1) for k, v in arts.items()},
        "latency": t,
        "max_abs_diff_vs_ort_fp32": {k: float(np.abs(v - ref).max()) for k, v in outs.items()},
        "top1_same_as_ort_fp32": {k: bool(v.argmax() == ref.argmax()) for k, v in outs.items()},
        "int8_layers": len(q["int8_layers"]),
        "float_layers": q["float_layers"],
        "int8_accuracy_check": q["accuracy"]["outputs"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", default="benchmarks/quantize")
    ap.add_argument("--openvino", action="store_true", help="also Kiln on the QDQ file and OpenVINO")
    ap.add_argument("--no-digits", action="store_true", help="skip the digits accuracy section")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kiln-quant-"))
    d = None if a.no_digits else digits(tmp)
    rows = [zoo_model(m, tmp, a.seconds, a.openvino) for m in a.models.split(",")]
    from kiln.runtime.hostinfo import cpu_model_name

    lines = [
        f"Kiln {kiln.__version__}, `-mcpu={kiln.target.Target.parse(None).mcpu}` ({cpu_model_name()}), 2 threads, "
        "batch 1, untuned default schedules.",
        "",
    ]
    if d is not None:
        lines += [
            f"## Digits (scikit-learn), small CNN trained by benchmarks/digits_cnn.py, {d['test_samples']} test images",
            "",
        ]
        lines += table(
            ["engine", "test accuracy"],
            [[k, f"{d[k] * 100:.2f}%"] for k in ("numpy_fp32", "kiln_fp32", "kiln_int8", "ort_int8")],
        )
        lines += [
            "",
            f"int8 layers: {', '.join(d['int8_layers'])}; float: "
            + "; ".join(f"{k} ({v})" for k, v in d["float_layers"].items()),
            "",
        ]
    for r in rows:
        lat = r["latency"]
        base, ort = lat["kiln_fp32"]["p50_ms"], lat["ort_fp32"]["p50_ms"]
        lines += [f"## {r['model']} (same input, engines alternating in blocks, medians)", ""]
        lines += table(
            [
                "engine",
                "p50 ms",
                "p90 ms",
                "runs",
                "vs Kiln fp32",
                "vs onnxruntime fp32",
                "max abs diff vs ORT fp32",
                "top-1 = ORT fp32",
            ],
            [
                [
                    k,
                    f"{v['p50_ms']:.2f}",
                    f"{v['p90_ms']:.2f}",
                    v["runs"],
                    f"{v['p50_ms'] / base:.2f}x",
                    f"{v['p50_ms'] / ort:.2f}x",
                    f"{r['max_abs_diff_vs_ort_fp32'][k.removeprefix('kiln_')]:.3g}",
                    r["top1_same_as_ort_fp32"][k.removeprefix("kiln_")],
                ]
                for k, v in lat.items()
            ],
        )
        lines += [
            "",
            f"int8: {r['int8_layers']} layers int8; float: "
            + "; ".join(f"{k} ({v})" for k, v in r["float_layers"].items()),
            f"compile: fp32 {r['fp32_compile_s']} s, int8 {r['int8_compile_s']} s "
            "(calibration + accuracy check included)",
            "",
        ]
    save(a.out, {"digits": d, "models": rows}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
