"""The arm64 reduced-precision matmul kernels run (kiln/schedules/kernels/bf16_matmul_arm.c: bfmmla;
fp16_matmul_arm.c: fmla .8h): small models built with `--precision bf16 --target graviton3` and `--precision fp16
--target rpi5` run in the C++ runner under qemu-aarch64 (`-cpu max`, which has BF16 and fullfp16) and match a float64
reference with the kernel's roundings and onnxruntime's float32. Needs the edge tools (see test_cpp_runner.py).

Tolerances: against the reference (inputs, weights and the GELU's output rounded to bf16/fp16 as the kernel rounds
them, then summed in float64) 2e-3 of the output's largest magnitude, as for the x86 kernel
(tests/compiler/test_bf16_matmul_epilogue.py): float32 accumulation (fp16: partial sums of 16 products in fp16) plus a
GELU value within an ulp of a rounding boundary. Against onnxruntime's float32: 2e-2 of the largest magnitude for
bf16 (8 significant bits, 2^-8 = 0.4% per operand, summed over K), 5e-3 for fp16 (11 bits), and cosine > 0.9999."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper
from test_cpp_runner import AARCH64_RUNTIME, SYSROOT, _run, _unpack, aarch64_runner  # noqa: F401 (fixture)

import kiln

K, H = 64, 128


TYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}
TARGETS = {"bf16": "graviton3", "fp16": "rpi5"}
FP32_TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3}


def _round(a, precision: str):
    return np.asarray(a, np.float32).astype(TYPES[precision]).astype(np.float64)


def _mlp(rows: int):
    """matmul, bias, GELU (the TorchScript exporter's erf spelling), matmul, bias."""
    mk = helper.make_node
    nodes = [mk("MatMul", ["input", "w1"], ["m1"]), mk("Add", ["b1", "m1"], ["a1"])]
    nodes += [mk("Div", ["a1", "sq2"], ["d"]), mk("Erf", ["d"], ["e"]), mk("Add", ["e", "one"], ["e1"])]
    nodes += [mk("Mul", ["a1", "e1"], ["g0"]), mk("Mul", ["g0", "half"], ["g"])]
    nodes += [mk("MatMul", ["g", "w2"], ["m2"]), mk("Add", ["m2", "b2"], ["output"])]
    inits = {"w1": rand(K, H, seed=1) * 0.2, "b1": rand(H, seed=2), "w2": rand(H, K, seed=3) * 0.1}
    inits |= {"b2": rand(K, seed=4), "sq2": np.float32(math.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}
    return make_model(nodes, {"input": rand(1, rows, K)}, ["output"], inits)


def _mlp_reference(x, p: str):
    a1 = _round(x, p) @ _round(rand(K, H, seed=1) * 0.2, p) + rand(H, seed=2)
    g = 0.5 * a1 * (1 + np.vectorize(math.erf)(a1 / math.sqrt(2)))
    return _round(g, p) @ _round(rand(H, K, seed=3) * 0.1, p) + rand(K, seed=4)


def _dense(rows: int, k: int, n: int):
    """One matmul + bias with an odd K (the kernel converts x itself; K/4 has a partial last step)."""
    nodes = [helper.make_node("MatMul", ["input", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["output"])]
    return make_model(nodes, {"input": rand(1, rows, k)}, ["output"], {"w": rand(k, n, seed=1) * 0.1, "b": rand(n)})


def _dense_reference(x, p: str, k: int, n: int):
    return _round(x, p) @ _round(rand(k, n, seed=1) * 0.1, p) + rand(n)


CASES = {  # name: (model, input shape, reference, bf16 kernels, kernels with an epilogue)
    "mlp_17_rows": (_mlp(17), (1, 17, K), _mlp_reference, 2, 1),  # ragged: 17 rows, tiles of 8
    "mlp_32_rows": (_mlp(32), (1, 32, K), _mlp_reference, 2, 1),
    # odd K (bf16: the kernel converts x itself; K/4 and K/8 have a partial last step), and past one fp16 flush
    "dense_odd_k": (_dense(7, 33, 48), (1, 7, 33), lambda x, p: _dense_reference(x, p, 33, 48), 1, 0),
    # 48 column groups: one row task of all 100 rows, which the kernels take 48 rows at a time
    "dense_100_rows": (_dense(100, 40, 768), (1, 100, 40), lambda x, p: _dense_reference(x, p, 40, 768), 1, 0),
}
UNITS = {"bf16": "arm-bf16 bfmmla", "fp16": "arm-fp16 fmla .8h"}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_arm64_reduced_matmuls_under_qemu(tmp_path, aarch64_runner, name, precision):  # noqa: F811
    model, shape, reference, kernels, fused = CASES[name]
    r = kiln.compile(model, tmp_path / "arm.kiln", target=TARGETS[precision], precision=precision)
    assert r.manifest["arch"] == "aarch64" and r.report[f"{precision}_kernel_matmuls"] == kernels
    assert r.report["bf16_matmul_epilogues_fused"] == fused
    kinds = {f"{precision}_matmul"}
    units = {v["unit"] for v in r.manifest["buckets"][0]["kernel_info"].values() if v["kind"] in kinds}
    assert units == {UNITS[precision]}

    x = rand(*shape, seed=9)
    np.save(tmp_path / "x.npy", x)
    libs = f"{AARCH64_RUNTIME / 'tvm' / 'lib'}:{AARCH64_RUNTIME / 'tvm_ffi' / 'lib'}"
    qemu = ["qemu-aarch64", "-cpu", "max", "-L", str(SYSROOT), "-E", f"LD_LIBRARY_PATH={libs}", str(aarch64_runner)]
    run = _run(qemu, _unpack(tmp_path / "arm.kiln", tmp_path / "arm"), tmp_path / "out", tmp_path / "x.npy")
    assert run.returncode == 0, run.stderr[-2000:]
    out = np.load(tmp_path / "out" / "output.npy")

    ref = reference(x, precision)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-3 * np.abs(ref).max())
    fp32 = ort_run(model, {"input": x})[0]
    np.testing.assert_allclose(out, fp32, rtol=0, atol=FP32_TOLERANCE[precision] * np.abs(fp32).max())
    assert float((out.ravel() @ fp32.ravel()) / np.linalg.norm(out) / np.linalg.norm(fp32)) > 0.9999
