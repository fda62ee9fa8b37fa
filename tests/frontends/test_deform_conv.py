"""DeformConv (opset 19; DCN backbones, torchvision.ops.deform_conv2d exported with a symbolic) compiles as
GridSample taps and a grouped MatMul (decompose/deform_conv.py) and matches onnxruntime: with and without the
modulation mask and bias, groups and offset groups, strides, pads and dilations, offsets of a few pixels so
taps fall between pixels and outside the image."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import helper

N, C, H, W, M, K = 1, 4, 9, 11, 6, 3


@pytest.mark.parametrize(
    "group, offset_group, mask, bias, stride, pad, dil",
    [
        (1, 1, True, True, 1, 1, 1),  # DCNv2 as torchvision exports it
        (2, 2, True, True, 1, 1, 1),
        (1, 1, False, False, 2, 0, 1),  # DCNv1, strided, unpadded
        (1, 4, True, False, 1, 1, 2),  # an offset group per channel, dilated
    ],
)
def test_deform_conv_matches_onnxruntime(tmp_path, group, offset_group, mask, bias, stride, pad, dil):
    ho = (H + 2 * pad - dil * (K - 1) - 1) // stride + 1
    wo = (W + 2 * pad - dil * (K - 1) - 1) // stride + 1
    feeds = {"x": rand(N, C, H, W), "offset": 3 * rand(N, offset_group * 2 * K * K, ho, wo, seed=1)}
    inits = {"w": rand(M, C // group, K, K, seed=2)}
    names = ["x", "w", "offset", ""]
    if bias:
        inits["b"] = rand(M, seed=3)
        names[3] = "b"
    if mask:
        feeds["mask"] = np.abs(rand(N, offset_group * K * K, ho, wo, seed=4)) % 1
        names.append("mask")
    node = helper.make_node(
        "DeformConv",
        names,
        ["y"],
        group=group,
        offset_group=offset_group,
        kernel_shape=[K, K],
        strides=[stride] * 2,
        pads=[pad] * 4,
        dilations=[dil] * 2,
    )
    model = make_model([node], feeds, ["y"], inits, opset=19)
    check_against_ort(model, feeds, tmp_path, rtol=1e-4, atol=1e-4)
