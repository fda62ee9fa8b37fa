"""FuseDepthwisePointwise: an inverted residual's depthwise conv (+ bias, ReLU6) and its 1x1
projection become one kernel (with the projection's bias and residual add fused by FuseEpilogue);
numerics against onnxruntime, kernel counts against the pass disabled, and when it must not fuse."""

import numpy as np
import pytest
from helpers import make_model, mobilenet_block, ort_run, rand
from onnx import helper

import kiln


def _compile_and_compare(model, tmp_path, name, batch=1, **kw):
    r = kiln.compile(model, tmp_path / f"{name}.kiln", **kw)
    x = rand(batch, 16, 14, 14, seed=9)
    ours = kiln.load(tmp_path / f"{name}.kiln").run({"x": x})
    for got, ref in zip(ours.values(), ort_run(model, {"x": x})):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    return r.report


@pytest.mark.parametrize("stride, batch", [(1, 1), (2, 1), (2, 3)], ids=["residual", "stride2", "stride2_batch3"])
def test_inverted_residual_fuses_into_one_kernel(tmp_path, stride, batch):
    model = mobilenet_block(stride, batch=batch)
    fused = _compile_and_compare(model, tmp_path, "fused", batch)
    apart = _compile_and_compare(model, tmp_path, "apart", batch, disabled_passes=("FuseDepthwisePointwise",))
    assert fused["depthwise_fused"] == 1 and apart["depthwise_fused"] == 0
    assert (
        fused["ops_after"].get("nn.conv2d_depthwise_pointwise") == 1 and fused["ops_after"].get("nn.conv2d") == 1
    )  # the expand conv
    assert apart["ops_after"].get("nn.conv2d") == 3
    assert fused["kernels"] == apart["kernels"] - 1  # bias, ReLU6, projection bias (and residual add) inside it
    assert fused["conv_layouts"] == apart["conv_layouts"]  # still counted as two convs


def test_channel_multiplier_is_not_fused(tmp_path):
    """A depthwise conv with 2 outputs per channel (64 from 32) is not the per-channel kernel the
    fused compute implements: left as two convs, numerics still right."""
    report = _compile_and_compare(mobilenet_block(1, 2), tmp_path, "multiplier")
    assert report["depthwise_fused"] == 0 and report["ops_after"].get("nn.conv2d") == 3


def test_not_fused_when_the_depthwise_result_is_also_an_output(tmp_path):
    """The depthwise result is a model output too: fusing would have to compute it twice, so the
    pass leaves the pair alone."""
    c = 32
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["e"]),
        helper.make_node("Conv", ["e", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["d"], ["d6"]),
        helper.make_node("Conv", ["d6", "w2"], ["p"]),
    ]
    inits = {
        "w1": rand(c, 16, 1, 1, seed=1) * 0.3,
        "wd": rand(c, 1, 3, 3, seed=3) * 0.3,
        "bd": rand(c, seed=4),
        "w2": rand(16, c, 1, 1, seed=5) * 0.3,
    }
    model = make_model(nodes, {"x": rand(1, 16, 14, 14)}, ["p", "d6"], inits)
    report = _compile_and_compare(model, tmp_path, "shared")
    assert report["depthwise_fused"] == 0 and report["ops_after"].get("nn.conv2d") == 3


def test_not_fused_when_a_depthwise_row_exceeds_the_stack_buffer(tmp_path):
    """64 channels x 300 output columns is 75 KiB of depthwise results per row, over the kernel's
    64 KiB stack buffer: the pair stays two kernels (a fused kernel the schedule refused would run
    unscheduled)."""
    c = 64
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["e"]),
        helper.make_node("Conv", ["e", "wd"], ["d"], group=c, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d", "w2"], ["y"]),
    ]
    inits = {
        "w1": rand(c, 16, 1, 1, seed=1) * 0.3,
        "wd": rand(c, 1, 3, 3, seed=3) * 0.3,
        "w2": rand(16, c, 1, 1, seed=5) * 0.3,
    }
    x = rand(1, 16, 3, 300, seed=9)
    model = make_model(nodes, {"x": x}, ["y"], inits)
    r = kiln.compile(model, tmp_path / "wide.kiln")
    assert r.report["depthwise_fused"] == 0 and r.report["kernels_unscheduled"] == 0
    np.testing.assert_allclose(
        kiln.load(tmp_path / "wide.kiln").run({"x": x})["y"], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4
    )


def test_mobilenet_v1_block_with_batchnorm_and_relu(tmp_path):
    """MobileNetV1's separable conv: depthwise (no bias) -> BatchNorm -> Relu -> 1x1 -> BatchNorm ->
    Relu. FoldBatchNorm turns each BatchNorm into weights and a bias; the pair fuses, and the 1x1
    conv's bias and ReLU join the kernel."""
    c = 32
    bn = lambda name, n, seed: {
        f"{name}_s": rand(n, seed=seed) * 0.2 + 1,
        f"{name}_b": rand(n, seed=seed + 1),
        f"{name}_m": rand(n, seed=seed + 2) * 0.1,
        f"{name}_v": np.abs(rand(n, seed=seed + 3)) + 0.5,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["e"]),
        helper.make_node("Conv", ["e", "wd"], ["d"], group=c, pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["d", "bn1_s", "bn1_b", "bn1_m", "bn1_v"], ["dn"]),
        helper.make_node("Relu", ["dn"], ["dr"]),
        helper.make_node("Conv", ["dr", "w2"], ["p"]),
        helper.make_node("BatchNormalization", ["p", "bn2_s", "bn2_b", "bn2_m", "bn2_v"], ["pn"]),
        helper.make_node("Relu", ["pn"], ["y"]),
    ]
    inits = {
        "w1": rand(c, 16, 1, 1, seed=1) * 0.3,
        "wd": rand(c, 1, 3, 3, seed=3) * 0.3,
        "w2": rand(48, c, 1, 1, seed=5) * 0.3,
        **bn("bn1", c, 10),
        **bn("bn2", 48, 20),
    }
    model = make_model(nodes, {"x": rand(1, 16, 14, 14)}, ["y"], inits)
    report = _compile_and_compare(model, tmp_path, "v1")
    assert report["depthwise_fused"] == 1 and report["batchnorm_folded"] == 2
    # the expand conv, the fused pair with everything after it, the layout transforms in and out
    assert report["kernels"] == 4
    apart = _compile_and_compare(model, tmp_path, "v1_apart", disabled_passes=("FuseDepthwisePointwise",))
    assert apart["kernels"] == 5
