"""BF16MatmulKernel: --precision bf16 on AVX512-BF16 runs float32 matmuls by constant weights on the vdpbf16ps
C kernel (weights packed as bf16 at compile time, the bias added in the kernel). Numerics against a
bf16-rounded float64 reference and onnxruntime fp32, which matmuls it takes, and the assembly."""

import ml_dtypes
import numpy as np
import pytest
from helpers import make_model, ort_run, rand, target_cpu_flags
from onnx import helper

import kiln

needs_bf16 = pytest.mark.skipif(
    "avx512_bf16" not in target_cpu_flags(), reason="running it needs AVX512-BF16 (host and target)"
)


def _dense(rows: int, k: int, n: int, bias: bool = True, lead=(1,)):
    nodes = [helper.make_node("MatMul", ["input", "w"], ["mm" if bias else "output"])]
    inits = {"w": rand(k, n, seed=1) * 0.1}
    if bias:
        nodes.append(helper.make_node("Add", ["mm", "b"], ["output"]))
        inits["b"] = rand(n, seed=2)
    return make_model(nodes, {"input": rand(*lead, rows, k)}, ["output"], inits)


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


@needs_bf16
@pytest.mark.parametrize(
    "rows, k, n, bias", [(128, 768, 2304, True), (7, 33, 48, True), (197, 64, 80, False), (1, 256, 1000, True)]
)  # the last: a classifier, its 1000 columns padded to 1008 and the output sliced back
def test_bf16_matmul_matches_a_bf16_reference(tmp_path, rows, k, n, bias):
    m = _dense(rows, k, n, bias)
    r = kiln.compile(m, tmp_path / "m.kiln", precision="bf16")
    assert r.report["bf16_kernel_matmuls"] == 1
    x = rand(1, rows, k, seed=3)
    out = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    ref = _bf16(x) @ _bf16(rand(k, n, seed=1) * 0.1) + (rand(n, seed=2) if bias else 0)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max())
    fp32 = ort_run(m, {"input": x})[0]
    cos = float((out.ravel() @ fp32.ravel()) / np.linalg.norm(out) / np.linalg.norm(fp32))
    assert cos > 0.9999


def test_what_it_takes(tmp_path):
    # fewer than 16 columns stay float32 (40 are padded to 48); the fp32 build never takes any
    r = kiln.compile(_dense(8, 32, 12), tmp_path / "a.kiln", precision="bf16", target="llvm -mcpu=znver4")
    assert r.report["bf16_kernel_matmuls"] == 0
    r = kiln.compile(_dense(8, 32, 40), tmp_path / "c.kiln", precision="bf16", target="llvm -mcpu=znver4")
    assert r.report["bf16_kernel_matmuls"] == 1
    r = kiln.compile(_dense(8, 32, 48), tmp_path / "b.kiln", target="llvm -mcpu=znver4")
    assert r.report["bf16_kernel_matmuls"] == 0


def test_no_avx512_bf16_no_kernel(tmp_path):
    r = kiln.compile(_dense(8, 32, 48), tmp_path / "m.kiln", precision="bf16", target="llvm -mcpu=skylake-avx512")
    assert r.report["bf16_kernel_matmuls"] == 0


def test_the_kernel_is_vdpbf16ps():
    import subprocess

    from kiln.schedules.kernels import build

    obj, _ = build("bf16_matmul")
    asm = subprocess.run(["objdump", "-d", obj], capture_output=True, text=True, check=True).stdout
    assert asm.count("vdpbf16ps") >= 10 and "vcvtne2ps2bf16" in asm
