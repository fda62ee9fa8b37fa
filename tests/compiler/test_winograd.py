"""The Winograd pass end to end: which convs it takes (3x3, stride 1, padding 1, NCHWc, float32),
numerics against onnxruntime with and without it, and `--disable-pass Winograd`."""

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln
from kiln.compiler.backends.cpu import f32_conv_kernel
from kiln.compiler.options import CompileOptions
from kiln.target import Target


def _model(batch=1, last=64):
    """Five 3x3 convs on 32 channels: 16x16 (F(4x4, 3x3); one with a residual add), stride 2 and
    padding 0 (direct), then 6x6 to `last` channels (F(2x2, 3x3); direct below SMALL_GEMM_OUTPUTS).
    16x16 is the smallest F(4x4) output (MIN_F4)."""
    conv = lambda i, o, w, **kw: helper.make_node("Conv", [i, w, w + "_b"], [o], kernel_shape=[3, 3], **kw)
    nodes = [
        conv("input", "c1", "w1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        conv("r1", "c2", "w2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "input"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        conv("r2", "c3", "w3", pads=[1, 1, 1, 1], strides=[2, 2]),
        conv("c3", "c4", "w4"),
        conv("c4", "output", "w5", pads=[1, 1, 1, 1]),
    ]
    inits = {}
    for i in range(1, 6):
        inits[f"w{i}"] = rand(last if i == 5 else 32, 32, 3, 3, seed=i) * 0.1
        inits[f"w{i}_b"] = rand(last if i == 5 else 32, seed=10 + i)
    return make_model(nodes, {"input": rand(batch, 32, 16, 16)}, ["output"], inits)


@pytest.mark.parametrize(
    "disabled, batch", [((), 1), (("Winograd",), 1), ((), 2)], ids=["winograd", "direct", "winograd_batch2"]
)
def test_winograd_convs_match_onnxruntime(tmp_path, disabled, batch):
    m = _model(batch)
    r = kiln.compile(m, tmp_path / "m.kiln", disabled_passes=disabled)
    # the 6x6 map's F(2x2) (9 tiles) runs direct where AVX-512's fp32 conv kernel takes it (Winograd small_direct)
    assert r.report["winograd_convs"] == (0 if disabled else 2 if f32_conv_kernel(CompileOptions.make()) else 3)
    assert r.report["ops_after"].get("nn.conv2d_winograd", 0) == r.report["winograd_convs"]
    assert r.report["conv_layouts"] == {f"NCHW{Target.parse(None).caps.f32_block}c": 5}  # the host's vector block
    x = rand(batch, 32, 16, 16, seed=99)
    out = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    ref = ort_run(m, {"input": x})[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_small_gemms_stay_direct(tmp_path):
    """F(2x2) on a 6x6 map (9 tiles) to 32 channels: GEMMs of 9 rows by two output blocks, slower than the
    direct conv (passes/winograd.SMALL_GEMM_TILES); the 16x16 convs keep F(4x4)."""
    m = _model(last=32)
    r = kiln.compile(m, tmp_path / "m.kiln")
    assert r.report["winograd_convs"] == 2
    x = rand(1, 32, 16, 16, seed=99)
    out = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    np.testing.assert_allclose(out, ort_run(m, {"input": x})[0], rtol=1e-4, atol=1e-4)


def test_winograd_needs_a_blocked_float_layout(tmp_path):
    """In NCHW (no channel blocks) the convs stay direct."""
    r = kiln.compile(_model(), tmp_path / "m.kiln", layout="NCHW")
    assert r.report["winograd_convs"] == 0 and r.report["conv_layouts"] == {"NCHW": 5}


@pytest.mark.parametrize("precision, dtype, tol", [("bf16", "bfloat16", 4e-2), ("fp16", "float16", 5e-3)])
def test_reduced_precision_3x3_convs_take_winograd(tmp_path, precision, dtype, tol):
    """Under --precision bf16/fp16 the 3x3 stride-1 convs whose data is a float32 tensor cast for them
    run Winograd on that float32 tensor (the first one through the layout transform that followed the
    cast), with the transformed weights stored in the reduced type; the strided and the unpadded conv
    stay direct. Where bf16 has the vdpbf16ps kernel, only F(4x4) convs take Winograd: the 6x6 one
    (F(2x2)) runs on vdpbf16ps too; on AMX-BF16 none do (the tile kernel beats F(4x4) too).
    (FuseBF16Epilogue is off: it would take the casts after the
    vdpbf16ps convs into their kernel, tests/compiler/test_bf16_epilogue.py.)"""
    m = _model()
    r = kiln.compile(m, tmp_path / "m.kiln", precision=precision, disabled_passes=("FuseBF16Epilogue",))
    direct = kiln.compile(m, tmp_path / "d.kiln", precision=precision, disabled_passes=("Winograd", "FuseBF16Epilogue"))
    vdpbf16ps = precision == "bf16" and "avx512bf16" in r.manifest["cpu_features"]
    amx = vdpbf16ps and "amx-bf16" in r.manifest["cpu_features"]
    taken = 0 if amx else 2 if vdpbf16ps else 3
    assert r.report["winograd_convs"] == taken and direct.report["winograd_convs"] == 0
    assert (
        r.report["ops_after"]["astype"] == direct.report["ops_after"]["astype"] - taken
    )  # their casts are gone, not converted back
    if vdpbf16ps:
        assert r.report["bf16_kernel_convs"] == 5 - taken and direct.report["bf16_kernel_convs"] == 5
    stored = {(tuple(w["shape"]), w["dtype"]) for w in r.manifest["weights"]}
    lanes = Target.parse(None).caps.f32_block  # the host's vector block: 16 on AVX-512, 8 on AVX2
    assert (((6, 6, 32 // lanes, 32, lanes), dtype) in stored) == (not amx)  # U of F(4x4) at 16x16
    assert (((4, 4, 64 // lanes, 32, lanes), dtype) in stored) == (not vdpbf16ps)  # U of F(2x2) at 6x6
    x = rand(1, 32, 16, 16, seed=99)
    ref = ort_run(m, {"input": x})[0]
    for path in ("m.kiln", "d.kiln"):
        out = kiln.load(tmp_path / path).run({"input": x})["output"]
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * np.abs(ref).max())
