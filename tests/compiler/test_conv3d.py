"""conv3d through Kiln's output-channel-vectorized compute and schedule (legalize_conv3d,
schedules/conv3d): onnxruntime's numbers for what video ResNets (torchvision's r3d_18) use: a
3-channel strided stem, 3x3x3 convs with padding, stride 2, 1x1x1 projections, channels that
block by 8, and TVM's compute where Kiln's does not apply (groups)."""

import pytest
from helpers import check_against_ort, make_model, rand
from onnx import helper

pytestmark = pytest.mark.filterwarnings("error::kiln.errors.KilnWarning")


@pytest.mark.parametrize(
    "c_in,c_out,dhw,k,groups,attrs",
    [
        (3, 32, (4, 20, 20), (3, 7, 7), 1, {"strides": [1, 2, 2], "pads": [1, 3, 3, 1, 3, 3]}),  # r3d's stem
        (32, 32, (4, 10, 10), (3, 3, 3), 1, {"pads": [1, 1, 1, 1, 1, 1]}),
        (32, 64, (4, 10, 10), (3, 3, 3), 1, {"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}),
        (32, 64, (4, 10, 10), (1, 1, 1), 1, {"strides": [2, 2, 2]}),  # the downsample projection
        (16, 24, (3, 9, 9), (3, 3, 3), 1, {"pads": [1, 1, 1, 1, 1, 1], "dilations": [1, 2, 1]}),  # block 8
        (16, 16, (3, 6, 6), (3, 3, 3), 4, {"pads": [1, 1, 1, 1, 1, 1]}),  # grouped: TVM's compute
    ],
)
def test_conv3d_matches_onnxruntime(tmp_path, c_in, c_out, dhw, k, groups, attrs):
    x = rand(1, c_in, *dhw)
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], kernel_shape=list(k), group=groups, **attrs),
        helper.make_node("Relu", ["c"], ["output"]),
    ]
    inits = {"w": rand(c_out, c_in // groups, *k, seed=1) * 0.2, "b": rand(c_out, seed=2)}
    check_against_ort(make_model(nodes, {"input": x}, ["output"], inits), {"input": x}, tmp_path, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mcpu,reg,accumulators", [("znver4", "zmm", 16), ("haswell", "ymm", 8)])
def test_conv3d_register_tile_follows_the_register_file(mcpu, reg, accumulators):
    """2 channel vectors x 8 pixels with AVX-512's 32 registers, 1 x 8 with AVX2's 16 (conv3d_tile)."""
    import re

    from helpers import compiled_asm

    x = rand(1, 32, 4, 8, 8)
    model = make_model(
        [helper.make_node("Conv", ["input", "w"], ["output"], kernel_shape=[3, 3, 3], pads=[1] * 6)],
        {"input": x},
        ["output"],
        {"w": rand(32, 32, 3, 3, 3, seed=1)},
    )
    asm, _ = compiled_asm(model, f"llvm -mcpu={mcpu}")
    fmas = [line for line in asm.splitlines() if "vfmadd231ps" in line]
    assert fmas and all(reg in line for line in fmas), fmas[:5]  # full-width vector FMAs only
    destinations = {re.findall(r"%[xyz]mm\d+", line)[-1] for line in fmas}
    assert len(destinations) >= accumulators, sorted(destinations)  # LLVM may rename some of the unrolled copies
