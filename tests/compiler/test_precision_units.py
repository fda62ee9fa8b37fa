"""Per-layer precision: the manifest's kernel_info and `kiln inspect` name each kernel's precision and the unit that
runs it, and why a multiply-add layer of a bf16 build stayed float32."""

import platform

import numpy as np
import pytest
from helpers import make_model, rand
from onnx import helper

import kiln
from kiln.compiler.precision_units import WHY_WIDER, describe, summary
from kiln.describe import format_text, inspect_path
from kiln.target import Target

x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="builds Kiln's x86 C kernels (AVX512-BF16)")


def _encoder_block(softmax: bool = True):
    """A projection by constant weights (bf16 kernel) feeding attention (the bf16 attention kernel on AVX512-BF16);
    without the softmax, a matmul of two activations (no bf16 kernel takes it: it stays float32)."""
    n = helper.make_node
    nodes = [
        n("MatMul", ["input", "wq"], ["q"]),
        n("Transpose", ["input"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["s" if softmax else "output"]),
    ]
    if softmax:
        nodes += [n("Softmax", ["s"], ["p"], axis=-1), n("MatMul", ["p", "input"], ["output"])]
    return make_model(nodes, {"input": rand(1, 2, 32, 64)}, ["output"], {"wq": rand(64, 64, seed=1) * 0.1})


@x86
def test_bf16_build_names_units(tmp_path):
    kiln.compile(_encoder_block(), tmp_path / "m.kiln", precision="bf16", target="llvm -mcpu=znver4")
    info = inspect_path(tmp_path / "m.kiln")
    kernels = info["manifest"]["buckets"][0]["kernel_info"].values()
    assert sorted(v["kind"] for v in kernels if v["precision"] == "bf16") == ["attention", "bf16_matmul"]
    assert {v["unit"] for v in kernels if v["precision"] == "bf16"} == {"avx512-bf16 vdpbf16ps"}
    assert not [v for v in kernels if "why" in v]
    assert "compute  bf16 on avx512-bf16 vdpbf16ps: 2 kernel(s)" in format_text(info)


@x86
def test_bf16_build_says_why_a_layer_stayed_wider(tmp_path):
    kiln.compile(_encoder_block(softmax=False), tmp_path / "m.kiln", precision="bf16", target="llvm -mcpu=znver4")
    info = inspect_path(tmp_path / "m.kiln")
    kernels = info["manifest"]["buckets"][0]["kernel_info"].values()
    units = {(v["precision"], v["unit"]) for v in kernels}
    assert ("bf16", "avx512-bf16 vdpbf16ps") in units and ("fp32", "fp32 FMA avx512") in units
    assert [v["why"] for v in kernels if "why" in v] == [WHY_WIDER["matmul"]]
    text = format_text(info)
    assert "compute  bf16 on avx512-bf16 vdpbf16ps: 1 kernel(s)" in text and "wider    " in text


def test_units_per_target():
    avx2, znver4 = Target.parse("llvm -mcpu=haswell").caps, Target.parse("llvm -mcpu=znver4").caps
    assert describe("matmul", False, False, None, "fp32", avx2) == {"precision": "fp32", "unit": "fp32 FMA avx2"}
    assert describe("conv2d_int8", True, False, None, "fp32", znver4)["unit"] == "avx512-vnni"
    assert describe("f32_matmul", False, False, None, "fp32", znver4)["unit"] == "fp32 FMA avx512"
    assert describe("conv2d_int8", True, False, None, "fp32", avx2)["unit"] == "avx2-pmaddubsw"
    assert describe("bf16_conv", False, True, None, "bf16", znver4)["unit"] == "amx-bf16 tdpbf16ps"
    assert "why" not in describe("matmul", False, False, None, "fp32", znver4)  # fp32 builds: nothing to explain
    got = describe("matmul", False, False, "bfloat16", "bf16", znver4)
    assert got["unit"] == "fp32 FMA avx512 (bfloat16 stored, converted)" and "why" not in got


def test_summary_shares():
    info = {
        "a": {"precision": "bf16", "unit": "u1", "flops": 300, "calls": 2},
        "b": {"precision": "fp32", "unit": "u2", "flops": 400, "calls": 1},
    }
    rows = summary(info)
    assert [r[:3] for r in rows] == [("bf16", "u1", 1), ("fp32", "u2", 1)]
    assert np.isclose(sum(r[3] for r in rows), 1.0) and np.isclose(rows[0][3], 0.6)
