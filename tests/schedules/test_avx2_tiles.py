"""float32 conv register tiles on 16-register targets (AVX2): the tile shape per output width, the
unrolled channel block in the generated assembly (compiled for haswell, not run), and the haswell
build's numerics, run on any x86-64 host with AVX2 and FMA (AVX2 code runs on AVX-512 CPUs)."""

import re

import numpy as np
import pytest
from helpers import check_against_ort, compiled_asm, make_model, mobilenet_block, ort_run, rand
from onnx import helper

import kiln
from kiln.compiler.hostrun import missing_on_host
from kiln.schedules.rules.tiles import conv_register_tile
from kiln.target import Target

HASWELL = "llvm -mcpu=haswell"


def test_conv_register_tile_per_width():
    # (pixels, channel blocks): 8 accumulators, the most FMAs per load, then more channel blocks
    assert conv_register_tile(56, 32, 16) == (2, 4)
    assert conv_register_tile(14, 128, 16) == (2, 4)
    assert conv_register_tile(7, 256, 16) == (7, 1)  # 7-wide maps: a row of 7, not 1 pixel x 4 blocks
    assert conv_register_tile(13, 2, 16) == (1, 2)
    assert conv_register_tile(56, 32, 32) is None  # 32 registers keep the measured 8-pixel row tile


def _conv(cin, cout, hw, k, stride=1):
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[k // 2] * 4, strides=[stride, stride]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    return make_model(nodes, {"x": rand(1, cin, hw, hw)}, ["y"], {"w": rand(cout, cin, k, k, seed=1) * 0.1})


def test_avx2_1x1_conv_unrolls_a_channel_block():
    """2 pixels x 4 blocks of 8 channels, the 8 input channels of a block unrolled: 64 ymm FMAs, none
    on a memory operand; the AVX-512 build of the same conv keeps its zmm row tile."""
    asm, report = compiled_asm(_conv(64, 256, 56, 1), HASWELL)
    assert report["conv_layouts"] == {"NCHW8c": 1}
    assert len(re.findall(r"vfmadd\w+\s+%ymm", asm)) == 64 and not re.search(r"vfmadd\w+\s+[^%\s]", asm)
    asm, _ = compiled_asm(_conv(64, 256, 56, 1), "llvm -mcpu=znver4")
    assert "ymm" not in " ".join(re.findall(r"vfmadd\w+\s+[^\n]+", asm))


def test_avx2_padded_strided_conv_pads_apart_and_unrolls_a_channel_block():
    """A 3x3/s2 conv with a 2 pixel x 4 block tile pads its input in a stage of its own, so its reduction
    reads without bounds tests and unrolls the 8 channels of a block: 64 ymm FMAs (with the padding
    inlined LLVM unrolled the taps' bounds cases into 416)."""
    asm, report = compiled_asm(_conv(32, 64, 28, 3, stride=2), HASWELL)
    assert report["conv_layouts"] == {"NCHW8c": 1}
    assert len(re.findall(r"vfmadd\w+\s+%ymm", asm)) == 64


@pytest.mark.parametrize(
    "cin,cout,hw,k,stride",
    [(32, 64, 14, 1, 1), (16, 32, 7, 1, 1), (24, 32, 12, 3, 1), (16, 16, 9, 3, 2), (16, 32, 16, 3, 2)],
)
def test_avx2_conv_tiles_match_onnxruntime(tmp_path, cin, cout, hw, k, stride):
    """The haswell build (1x1 tiles, Winograd's GEMM tile for the 3x3/s1, direct 3x3/s2 with the padding
    inlined (5 wide: a 1-block tile) and apart (8 wide: 2 pixels x 4 blocks)), run here."""
    missing = missing_on_host(Target.parse(HASWELL))
    if missing:
        pytest.skip(f"this host cannot run {HASWELL} code (lacks {', '.join(missing)})")
    model = _conv(cin, cout, hw, k, stride)
    check_against_ort(model, {"x": rand(1, cin, hw, hw, seed=3)}, tmp_path, target=HASWELL, layout="NCHWc")


@pytest.mark.parametrize("stride", [1, 2])
def test_avx2_fused_depthwise_pointwise_matches_onnxruntime(tmp_path, stride):
    """The haswell build of an inverted residual: the fused depthwise + 1x1 kernel with the 16-register
    tile (2 pixels x 2 blocks here) and the buffer's channel blocks unrolled, run here."""
    missing = missing_on_host(Target.parse(HASWELL))
    if missing:
        pytest.skip(f"this host cannot run {HASWELL} code (lacks {', '.join(missing)})")
    model, x = mobilenet_block(stride), rand(1, 16, 14, 14, seed=4)
    res = kiln.compile(model, tmp_path / "m.kiln", target=HASWELL)
    assert res.report["depthwise_fused"] == 1
    got = kiln.load(tmp_path / "m.kiln").run({"x": x})["y"]
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
