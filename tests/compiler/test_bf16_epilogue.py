"""FuseBF16Epilogue: the bias, residual add, ReLU and bf16 cast after a vdpbf16ps conv run in its C kernel."""

import re

import numpy as np
import pytest
from helpers import bf16_block as _block
from helpers import ort_run, rand

import kiln
from kiln.compiler.passes.bf16_conv_kernel import kernel_func

ZNVER4 = "llvm -mcpu=znver4"
EP_RES, EP_F32, EP_RES16 = 2, 8, 32  # bf16_epilogue.h


def test_kernel_tasks():
    """Pairs of output-channel blocks where there are at least as many as rows (or CHANNEL_TASKS), else rows."""

    def parallel(ob, hw):
        f, _ = kernel_func((1, 2, hw, hw, 16), ob, (1, 1), (1, 1), (0, 0, 0, 0))
        return re.search(r"T.parallel\((\d+)\)", f.script()).group(1)

    assert parallel(ob=2, hw=8) == "8"  # 1 pair, 8 rows: rows
    assert parallel(ob=3, hw=2) == "2"  # 2 pairs (the last one a single block), 2 rows: pairs
    assert parallel(ob=32, hw=28) == "16"  # CHANNEL_TASKS pairs: enough whatever the rows


@pytest.mark.parametrize("c, hw", [(32, 8), (48, 2)], ids=["rows", "channel_pairs"])
def test_epilogues_run_in_the_bf16_kernel(tmp_path, c, hw):
    m = _block(c, hw)
    # residuals in float32 (BF16Residuals off): TVM's kernels compute a bf16 round trip inside a fused kernel in
    # float32, so only then are the two builds the same arithmetic
    fused = kiln.compile(m, tmp_path / "f.kiln", precision="bf16", disabled_passes=("BF16Residuals",))
    if "avx512bf16" not in fused.manifest["cpu_features"]:
        pytest.skip("no AVX512-BF16: bf16 convs have no vdpbf16ps kernel here")
    apart = kiln.compile(
        m, tmp_path / "a.kiln", precision="bf16", disabled_passes=("BF16Residuals", "FuseBF16Epilogue")
    )
    assert fused.report["bf16_kernel_convs"] == apart.report["bf16_kernel_convs"] == 5
    # c1: ReLU + cast; c2: bias + residual (proj) + ReLU, written float32 and bf16; proj: bias;
    # c3: bias + clip + cast; c4: bias + residual
    assert fused.report["bf16_epilogues_fused"] == 5 and apart.report["bf16_epilogues_fused"] == 0
    ops, before = fused.report["ops_after"], apart.report["ops_after"]
    assert (
        before["add"] == 6 and before["nn.relu"] == 2 and before["clip"] == 1 and before["astype"] == 4
    )  # input cast + one per conv a conv reads
    assert (
        ops.get("add", 0) == 0 and ops.get("nn.relu", 0) == 0 and ops.get("clip", 0) == 0 and ops["astype"] == 1
    )  # only the input's cast is left
    x = rand(1, c, hw, hw, seed=9)
    ref = ort_run(m, {"x": x})[0]
    got = kiln.load(tmp_path / "f.kiln").run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=4e-2, atol=4e-2 * np.abs(ref).max())
    # the same arithmetic as the separate TVM kernels: float32 sums in the same order, round-to-nearest-even casts
    np.testing.assert_array_equal(got, kiln.load(tmp_path / "a.kiln").run({"x": x})["y"])


def _flags(onnx_model, **opts) -> list[int]:
    """The epilogue flags of every bf16 conv kernel call after Kiln's graph passes for Zen 4 (AVX512-BF16)."""
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx

    opt = optimize(import_onnx(onnx_model).mod, CompileOptions.make(target=ZNVER4, precision="bf16", **opts))
    calls = re.findall(r'call_extern\("int32", "kiln_bf16_conv2d_nchw16c", (?:[\w.]+, ){6}(\d+),', opt.mod.script())
    return [int(f) for f in calls]


def test_residual_stream_in_bf16(tmp_path):
    """BF16Residuals: the residual adds read bf16 (EP_RES16: the block output's cast, the projection rounded) and
    no kernel writes float32 but the last (the graph's output); without the pass the residuals stay float32.
    Both builds match onnxruntime here."""
    m = _block(32, 8)
    on, off = _flags(m), _flags(m, disabled_passes=("BF16Residuals",))
    assert len(on) == len(off) == 5
    res16 = [f for f in on if f & EP_RES16]
    assert len(res16) == 2 and all(f & EP_RES for f in res16) and not any(f & EP_RES16 for f in off)
    assert sum(bool(f & EP_F32) for f in on) == 1 and sum(bool(f & EP_F32) for f in off) == 3
    r16 = kiln.compile(m, tmp_path / "r16.kiln", precision="bf16")
    if "avx512bf16" not in r16.manifest["cpu_features"]:
        pytest.skip("no AVX512-BF16: bf16 convs have no vdpbf16ps kernel here")
    assert r16.report["bf16_residuals"] == 2
    kiln.compile(m, tmp_path / "r32.kiln", precision="bf16", disabled_passes=("BF16Residuals",))
    x = rand(1, 32, 8, 8, seed=9)
    ref = ort_run(m, {"x": x})[0]
    got16, got32 = (kiln.load(tmp_path / f"{n}.kiln").run({"x": x})["y"] for n in ("r16", "r32"))
    for got in (got16, got32):
        np.testing.assert_allclose(got, ref, rtol=4e-2, atol=4e-2 * np.abs(ref).max())
    assert not np.array_equal(got16, got32)  # the rounding is real
