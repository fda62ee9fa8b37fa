"""BF16MatmulKernel on AMX-BF16 (kernels/amx_bf16_matmul.c): a Sapphire Rapids build calls the tile kernel, whose
code holds tdpbf16ps (compiled, never run, on any host), weights padded to whole B tiles, each layer's unit named;
on a host with AMX-BF16 (skipped elsewhere, naming the feature) ragged row counts, odd and short K and the fused
epilogues against a bf16 reference and against the AVX512-BF16 kernel's build of the same graph run here."""

from __future__ import annotations

import re
import subprocess

import ml_dtypes
import numpy as np
import pytest
from helpers import make_model, rand
from onnx import helper

import kiln
from kiln.compiler.passes.bf16_matmul_kernel import AMX, BF16, pack, tasks
from kiln.runtime.hostinfo import missing_cpu_features

SPR = "llvm -mcpu=sapphirerapids -mtriple=x86_64-linux-gnu"
ZNVER4 = "llvm -mcpu=znver4 -mtriple=x86_64-linux-gnu"  # AVX512-BF16, no AMX
MISSING = missing_cpu_features(["amx-tile", "amx-bf16", "avx512bf16"])
needs_amx = pytest.mark.skipif(
    bool(MISSING), reason=f"running it needs AMX-BF16 (this host lacks {', '.join(MISSING)})"
)


def _ffn(rows: int, k: int, h: int):
    """matmul + bias + ReLU, then matmul + bias + the residual: both kernels take an epilogue."""
    mk = helper.make_node
    nodes = [mk("MatMul", ["input", "w1"], ["m1"]), mk("Add", ["m1", "b1"], ["a1"]), mk("Relu", ["a1"], ["g"])]
    nodes += [
        mk("MatMul", ["g", "w2"], ["m2"]),
        mk("Add", ["m2", "b2"], ["a2"]),
        mk("Add", ["a2", "input"], ["output"]),
    ]
    inits = {
        "w1": rand(k, h, seed=1) * 0.2,
        "b1": rand(h, seed=2),
        "w2": rand(h, k, seed=3) * 0.1,
        "b2": rand(k, seed=4),
    }
    return make_model(nodes, {"input": rand(1, rows, k)}, ["output"], inits)


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _reference(x, k: int, h: int):
    """float64 with the kernels' roundings: x, the weights and the ReLU's output in bf16."""
    g = np.maximum(_bf16(x) @ _bf16(rand(k, h, seed=1) * 0.2) + rand(h, seed=2), 0)
    return _bf16(g) @ _bf16(rand(h, k, seed=3) * 0.1) + rand(k, seed=4) + x


def test_sapphirerapids_calls_the_tile_kernel(tmp_path):
    """Which kernel each target's matmuls call (Zen 4: vdpbf16ps), the unit each layer names, and the tile
    instructions in the kernel's code."""
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx
    from kiln.schedules.kernels import build

    for spec, symbol, unit in (
        (SPR, "kiln_amx_bf16_matmul", "amx-bf16 tdpbf16ps"),
        (ZNVER4, "kiln_bf16_matmul", "avx512-bf16 vdpbf16ps"),
    ):
        opt = optimize(import_onnx(_ffn(20, 64, 128)).mod, CompileOptions.make(target=spec, precision="bf16"))
        assert re.findall(r'call_extern\("int32", "(\w+)"', opt.mod.script()) == [symbol, symbol]
        r = kiln.compile(_ffn(20, 64, 128), tmp_path / "m.kiln", precision="bf16", target=spec)
        assert r.report["bf16_kernel_matmuls"] == 2 and r.report["bf16_matmul_epilogues_fused"] == 2
        mm = [v for v in r.manifest["buckets"][0]["kernel_info"].values() if v["kind"] == "bf16_matmul"]
        assert len(mm) == 2 and {v["unit"] for v in mm} == {unit}, mm
    asm = subprocess.run(["objdump", "-d", build("amx_bf16_matmul")[0]], capture_output=True, text=True).stdout
    assert len(re.findall(r"tdpbf16ps\s+%tmm\d,%tmm\d,%tmm\d", asm)) >= 4
    assert "ldtilecfg" in asm and "tilerelease" in asm and "vcvtne2ps2bf16" in asm


def test_weights_are_padded_to_whole_b_tiles():
    """A B tile is 16 input pairs x 16 columns: K = 40 pads to 64 on AMX (zeros), to 40 for vdpbf16ps."""
    w = rand(40, 32, seed=1)
    amx, avx = pack(w, kt=AMX), pack(w, kt=BF16)
    assert amx.shape == (2, 32, 16, 2) and avx.shape == (2, 20, 16, 2)
    assert np.array_equal(amx[:, :20].view(np.uint16), avx.view(np.uint16))
    assert not amx[:, 20:].view(np.uint16).any()
    # tasks: whole 32-row steps of 2 column blocks, at least 8 tasks where there are rows to split
    rows, col_tasks, tile, per = tasks(128, 4, amx=True)
    assert (tile, per, col_tasks) == (32, 1, 2) and rows % 32 == 0 and col_tasks * -(-128 // rows) >= 4


@needs_amx
@pytest.mark.parametrize("rows, k, h", [(1, 64, 128), (17, 64, 96), (31, 48, 80), (33, 768, 256), (197, 112, 64)])
def test_ragged_shapes_match_a_bf16_reference_and_the_vdpbf16ps_build(tmp_path, rows, k, h):
    m = _ffn(rows, k, h)
    r = kiln.compile(m, tmp_path / "amx.kiln", precision="bf16", target="host")
    kiln.compile(m, tmp_path / "avx.kiln", precision="bf16", target=ZNVER4)
    units = {v["unit"] for v in r.manifest["buckets"][0]["kernel_info"].values() if v["kind"] == "bf16_matmul"}
    assert units == {"amx-bf16 tdpbf16ps"} and r.report["bf16_matmul_epilogues_fused"] == 2
    x = rand(1, rows, k, seed=9)
    got = kiln.load(tmp_path / "amx.kiln").run({"input": x})["output"]
    ref = _reference(x, k, h)
    # sums in another order than float64's: fp32 accumulation error; a ReLU output near a bf16 rounding boundary
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-3 * np.abs(ref).max())
    other = kiln.load(tmp_path / "avx.kiln").run({"input": x})["output"]
    np.testing.assert_allclose(got, other, rtol=0, atol=2e-3 * np.abs(ref).max())
