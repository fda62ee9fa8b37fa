"""BlockGroupedConv: grouped (not depthwise) convs in NCHW{b}c, groups narrower than the block merged on a
block diagonal. The block chosen per shape, the merged weights against NumPy, and compiled models against
onnxruntime on the host and in the AVX2 (haswell) build, whose 8-channel blocks take the groups directly."""

import numpy as np
import pytest
from helpers import check_against_ort, default_caps, make_model, rand
from onnx import helper

import kiln
from kiln.compiler.hostrun import missing_on_host
from kiln.compiler.passes.block_grouped_conv import merged_weights, plan
from kiln.target import Target

HASWELL = "llvm -mcpu=haswell"


def test_plan_per_shape():
    # (channels in, groups, outputs per group, vector block) -> (block, groups merged)
    assert plan(104, 13, 8, 16) == (8, 1)  # RegNetY's 104 channels: blocks of 8, one a group
    assert plan(48, 6, 8, 16) == (16, 2)  # 48 channels block by 16: two groups of 8 a block
    assert plan(48, 6, 8, 8) == (8, 1)  # AVX2: the 8-channel block is a group
    assert plan(256, 16, 16, 16) == (16, 1)
    assert plan(64, 2, 64, 16) == (16, 1)  # 32 in, 64 out a group: whole blocks on both sides
    assert plan(96, 4, 24, 16) == (8, 1)  # 24 a group: no 16-block, 8 divides it (with transforms)
    assert plan(64, 16, 4, 16) is None  # 4 a group: a merge of 4 is past MAX_MERGE, no block of 8 fits
    assert plan(24, 2, 12, 16) is None  # 12 a group: nothing of 8 or more divides it


def _conv_ref(x, w, groups):
    """A stride-1 unpadded grouped conv in NumPy."""
    o, per_in, kh, kw = w.shape
    per_out = o // groups
    n, _, h, wd = x.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1))
    for c in range(o):
        xs = x[:, c // per_out * per_in : (c // per_out + 1) * per_in]
        for dy in range(kh):
            for dx in range(kw):
                window = xs[:, :, dy : dy + out.shape[2], dx : dx + out.shape[3]]
                out[:, c] += np.einsum("nihw,i->nhw", window, w[c, :, dy, dx])
    return out


def test_merged_weights_compute_the_same_conv():
    x, w = rand(1, 24, 6, 6), rand(24, 4, 3, 3, seed=1)  # 6 groups of 4 -> 3 of 8
    merged = merged_weights(w, 6, 2)
    assert merged.shape == (24, 8, 3, 3)
    np.testing.assert_allclose(_conv_ref(x, merged, 3), _conv_ref(x, w, 6), rtol=1e-5, atol=1e-5)


def _model(c_in, c_out, groups, k=3, stride=1, pads=(1, 1, 1, 1), dilation=1, hw=12, batch=1):
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"]),  # a blocked producer, as in a real network
        helper.make_node(
            "Conv",
            ["a", "w", "b"],
            ["c"],
            group=groups,
            pads=list(pads),
            strides=[stride] * 2,
            dilations=[dilation] * 2,
        ),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    inits = {
        "w0": rand(c_in, 16, 1, 1, seed=1) * 0.3,
        "w": rand(c_out, c_in // groups, k, k, seed=2) * 0.3,
        "b": rand(c_out, seed=3),
    }
    return make_model(nodes, {"x": rand(batch, 16, hw, hw)}, ["y"], inits)


CASES = {  # name -> (c_in, c_out, groups, extra attributes)
    "merged_16c": (48, 48, 6, {}),
    "merged_stride2": (48, 48, 6, {"stride": 2}),
    "block8_13_groups": (104, 104, 13, {}),
    "wide_groups_more_outputs": (64, 128, 2, {}),
    "asymmetric_pads_dilated": (32, 32, 4, {"pads": (0, 1, 2, 1), "dilation": 2}),
    "pointwise_groups": (64, 64, 4, {"k": 1, "pads": (0, 0, 0, 0)}),
}


@pytest.mark.parametrize("target", [None, HASWELL], ids=["host", "haswell"])
@pytest.mark.parametrize("name", list(CASES))
def test_grouped_conv_blocked_matches_onnxruntime(tmp_path, name, target):
    if target and (missing := missing_on_host(Target.parse(target))):
        pytest.skip(f"this host cannot run {target} code (lacks {', '.join(missing)})")
    c_in, c_out, groups, kw = CASES[name]
    model = _model(c_in, c_out, groups, **kw)
    res = kiln.compile(model, tmp_path / "r.kiln", target=target)
    assert res.report["grouped_convs_blocked"] == 1 and res.report["conv_layouts"].get("NCHW", 0) == 0
    check_against_ort(model, {"x": rand(1, 16, 12, 12, seed=4)}, tmp_path, target=target)


def test_a_batch_of_two_matches_onnxruntime(tmp_path):
    model = _model(48, 48, 6, stride=2, batch=2)
    res = kiln.compile(model, tmp_path / "r.kiln")
    assert res.report["grouped_convs_blocked"] == 1
    check_against_ort(model, {"x": rand(2, 16, 12, 12, seed=5)}, tmp_path)


def test_disabled_the_grouped_conv_stays_nchw(tmp_path):
    model = _model(48, 48, 6)
    res = kiln.compile(model, tmp_path / "r.kiln", disabled_passes=["BlockGroupedConv"])
    assert res.report["conv_layouts"] == {f"NCHW{default_caps().f32_block}c": 1, "NCHW": 1}
    check_against_ort(model, {"x": rand(1, 16, 12, 12, seed=4)}, tmp_path, disabled_passes=["BlockGroupedConv"])
