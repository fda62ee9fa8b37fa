"""FuseBF16Epilogue: the bias, residual add, ReLU and bf16 cast after a vdpbf16ps conv run in its C kernel."""

import re

import numpy as np
import pytest
from helpers import bf16_block as _block
from helpers import ort_run, rand

import kiln
from kiln.compiler.passes.bf16_conv_kernel import kernel_func


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
    fused = kiln.compile(m, tmp_path / "f.kiln", precision="bf16")
    if "avx512bf16" not in fused.manifest["cpu_features"]:
        pytest.skip("no AVX512-BF16: bf16 convs have no vdpbf16ps kernel here")
    apart = kiln.compile(m, tmp_path / "a.kiln", precision="bf16", disabled_passes=("FuseBF16Epilogue",))
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
