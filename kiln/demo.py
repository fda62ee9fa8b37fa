"""`make demo`: build the default zoo model, compile it for this host, run it, and print its
max abs difference and median latency beside onnxruntime's on the same input."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx


def _median_ms(fn, warmup: int = 3, repeat: int = 20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _path_hint() -> str:
    """`make demo` installs `kiln` into the virtualenv, which is not on PATH: say how to get it there."""
    import os

    bin_dir = Path(sys.executable).parent
    rel = os.path.relpath(bin_dir)
    shown = rel if not rel.startswith("..") else str(bin_dir)
    return f"the kiln command is in {shown}: run `. {shown}/activate` to put it on PATH, then see the README's tour"


def main(name: str | None = None, out_dir: str = "build/demo") -> int:
    import onnxruntime as ort

    import kiln
    from kiln import zoo
    from kiln.runtime.hostinfo import physical_cores

    name = name or zoo.DEFAULT_MODEL
    builder, shape = zoo.MODELS[name]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    onnx_path, kiln_path = out / f"{name}.onnx", out / f"{name}.kiln"
    onnx.save(builder(), onnx_path)
    t = time.perf_counter()
    result = kiln.compile(onnx_path, kiln_path, input_shapes=[shape])
    print(f"compiled {onnx_path} -> {kiln_path} for '{result.manifest['target']}' in {time.perf_counter() - t:.1f} s")
    threads = physical_cores()
    model = kiln.load(kiln_path, num_threads=threads)
    spec = model.inputs[0]
    x = np.random.default_rng(0).standard_normal(spec.shape).astype(spec.dtype)
    ours = model.run({spec.name: x})[model.outputs[0].name]
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {spec.name: x})[0]
    diff = float(np.abs(ours - ref).max())
    ok = np.allclose(ours, ref, rtol=1e-4, atol=1e-4)
    repeat = 10 if name.startswith("resnet") else 20
    k_ms = _median_ms(lambda: model.run({spec.name: x}), repeat=repeat)
    o_ms = _median_ms(lambda: sess.run(None, {spec.name: x}), repeat=repeat)
    print(f"model {name}, input {spec.name} {'x'.join(map(str, spec.shape))}, {threads} thread(s)")
    print(f"max abs difference vs onnxruntime: {diff:.3g} ({'within' if ok else 'OUTSIDE'} rtol=atol=1e-4)")
    cov = result.report.get("tuned_coverage", 0.0)
    how = (
        f"tuned records from {result.manifest['compile_options']['tuning_db']} cover {cov:.0%} of the FLOPs, "
        "default schedules elsewhere"
        if result.report.get("tuned_kernels")
        else "untuned default schedules"
    )
    print(f"median latency: kiln {k_ms:.2f} ms, onnxruntime {o_ms:.2f} ms (kiln/ort = {k_ms / o_ms:.2f}x; {how})")
    print(_path_hint())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
