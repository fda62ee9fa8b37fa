"""DeformConv (opset 19; DCN backbones, torchvision.ops.deform_conv2d exported with a symbolic) compiles as
GridSample taps and a grouped MatMul (decompose/deform_conv.py) and matches onnxruntime: with and without the
modulation mask and bias, groups and offset groups, strides, pads and dilations, offsets of a few pixels so
taps fall between pixels and outside the image."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, ort_run, rand
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


def _dcn(c: int, m: int, hw: int, group: int = 1):
    feeds = {"x": rand(1, c, hw, hw), "offset": 3 * rand(1, 2 * K * K, hw, hw, seed=1)}
    feeds["mask"] = np.abs(rand(1, K * K, hw, hw, seed=4)) % 1
    inits = {"w": rand(m, c // group, K, K, seed=2), "b": rand(m, seed=3)}
    node = helper.make_node(
        "DeformConv", ["x", "w", "offset", "b", "mask"], ["y"], group=group, kernel_shape=[K, K], pads=[1] * 4
    )
    return make_model([node], feeds, ["y"], inits, opset=19), feeds


@pytest.mark.parametrize("group, kernels", [(1, 1), (2, 0)])
def test_ungrouped_deform_conv_gathers_pixel_rows_for_the_fp32_matmul_kernel(group, kernels):
    """groups = 1: the taps are gathered as rows of channels (four neighbours per tap, no GridSample) and the
    constant weight is the matmul's right operand, which the fp32 C kernel takes (ResNet-18-DCN's layer-3 matmul
    43% -> 76% of the FMA peak, the model 1.22x -> 0.96x onnxruntime on Zen 4); grouped convs keep GridSample.
    Structural, for a pinned AVX-512 target."""
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx

    model, _ = _dcn(32, 32, 7, group)
    imported = import_onnx(model).mod
    assert ("R.image.grid_sample" in imported.script()) == (group > 1)
    report = optimize(imported, CompileOptions.make(target="llvm -mcpu=znver4")).report
    assert report["f32_kernel_matmuls"] == kernels


def test_deform_conv_of_32_channels_matches_onnxruntime(tmp_path):
    model, feeds = _dcn(32, 32, 7)
    check_against_ort(model, feeds, tmp_path, rtol=1e-4, atol=1e-4)


def test_nan_and_far_offsets_read_nothing_outside_the_input(tmp_path):
    """Taps at NaN, infinite or far-off positions gather row 0 with weight 0 (fast-mode gathers do not check their
    indices): the run completes, and every output a finite tap feeds matches onnxruntime."""
    import kiln

    model, feeds = _dcn(32, 32, 7)
    off = feeds["offset"].copy()
    off[0, 0, 0, 0], off[0, 1, 3, 3], off[0, 2, 5, 5] = np.nan, np.inf, -1e30
    feeds = dict(feeds, offset=off)
    path = tmp_path / "m.kiln"
    kiln.compile(model, path)
    y = kiln.load(path).run(feeds)["y"]
    ref = ort_run(model, feeds)[0]
    keep = np.ones((7, 7), bool)
    keep[0, 0] = keep[3, 3] = keep[5, 5] = False  # the three output pixels the bad taps feed
    np.testing.assert_allclose(y[..., keep], ref[..., keep], rtol=1e-4, atol=1e-4)
    assert np.isfinite(y[:, :, 3, 3]).all() and np.isfinite(y[:, :, 5, 5]).all()  # an infinite or far tap reads 0
