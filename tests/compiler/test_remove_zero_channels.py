"""RemoveZeroChannels: golden IR across a residual block, a Concat and a depthwise conv (the
expected modules are built by hand from sliced weights, the folded biases computed by a separate
numpy convolution), numerics against onnxruntime through the whole default pipeline, the channels
that must stay, and the optional row a failure only skips."""

import importlib
import warnings

import numpy as np
import pytest
import tvm
from helpers import default_caps, make_model, ort_run
from onnx import helper
from tvm import relax

import kiln
from kiln.compiler.passes import RemoveZeroChannels

TARGET = tvm.target.Target({"kind": "llvm"})


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def run_mod(mod, x):
    with TARGET:
        ex = tvm.compile(relax.get_pipeline("zero")(mod), target=TARGET)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def const(a):
    return relax.const(np.asarray(a, dtype="float32"))


def conv(x, w, pad=0, groups=1):
    return relax.op.nn.conv2d(x, const(w), padding=[pad] * 4, groups=groups)


def module(x_shape, body):
    """main(x) with one dataflow block whose bindings body(bb, x) emits; returns the IRModule."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def plane_conv(w, k, hw, pad):
    """A stride-1 conv2d of constant input planes (value k[c]) in plain numpy: the expected bias."""
    xp = np.pad(np.ones((len(k), *hw)) * np.asarray(k, np.float64)[:, None, None], ((0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    out = np.zeros((w.shape[0], hw[0] + 2 * pad - kh + 1, hw[1] + 2 * pad - kw + 1))
    for i in range(out.shape[1]):
        for j in range(out.shape[2]):
            out[:, i, j] = np.einsum("ochw,chw->o", w.astype(np.float64), xp[:, i : i + kh, j : j + kw])
    return out[None]


def check(before, expected, x, removed):
    p = RemoveZeroChannels()
    after = p(before)
    tvm.ir.assert_structural_equal(after, expected)
    assert p.stats["zero_channels_removed"] == removed
    np.testing.assert_allclose(run_mod(after, x), run_mod(before, x), rtol=1e-5, atol=1e-5)
    return p


# ---------------------------------------------------------------- residual block
def _residual(wa, ba, wb, bb_, wc, bc):
    def body(bb, x):
        a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(conv(x, wa, 1)), const(ba)))))
        b = bb.emit(relax.op.add(bb.emit(conv(x, wb)), const(bb_)))
        s = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(a, b))))
        return relax.op.add(bb.emit(conv(s, wc)), const(bc))

    return module((1, 4, 6, 6), body)


def test_residual_block_drops_a_channel_only_every_branch_drops():
    wa, ba, wb, bb_ = rnd(8, 4, 3, 3, seed=1), rnd(1, 8, 1, 1, seed=2), rnd(8, 4, 1, 1, seed=3), rnd(1, 8, 1, 1, seed=4)
    wc, bc = rnd(5, 8, 1, 1, seed=5), rnd(1, 5, 1, 1, seed=6)
    wa[2], ba[0, 2] = 0, 0.5  # branch a: relu(0.5) = 0.5 everywhere
    wb[2], bb_[0, 2] = 0, 0.0  # branch b: 0, so the sum is the constant 0.5: it folds into conv c's bias
    wb[5], bb_[0, 5] = 0, 0.0  # only branch b is constant in channel 5: it stays
    keep = [0, 1, 3, 4, 5, 6, 7]
    folded = (bc + 0.5 * wc[:, 2].reshape(1, 5, 1, 1).astype(np.float64)).astype("float32")  # in float64, as the pass
    expected = _residual(wa[keep], ba[:, keep], wb[keep], bb_[:, keep], wc[:, keep], folded)
    p = check(_residual(wa, ba, wb, bb_, wc, bc), expected, rnd(1, 4, 6, 6, seed=7), removed=2)
    layers = {l["layer"]: l for l in p.stats["zero_channel_layers"]}
    assert layers["conv2d_0"]["out"] == [8, 7] and layers["conv2d_2"]["in"] == [8, 7]
    assert p.stats["zero_channel_flops_removed"] == sum(l["flops_before"] - l["flops_after"] for l in layers.values())


# ---------------------------------------------------------------- Concat
def _concat(w1, b1, w2, wc, bc):
    def body(bb, x):
        a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(conv(x, w1, 1)), const(b1)))))
        b = bb.emit(conv(x, w2, 1))
        c = bb.emit(relax.op.concat([a, b], axis=1))
        return relax.op.add(bb.emit(conv(c, wc, 1)), const(bc))

    return module((1, 3, 5, 5), body)


def test_concat_shifts_offsets_and_a_padded_consumer_gets_a_border_bias():
    w1, b1, w2 = rnd(4, 3, 3, 3, seed=1), rnd(1, 4, 1, 1, seed=2), rnd(3, 3, 3, 3, seed=3)
    wc, bc = rnd(6, 7, 3, 3, seed=4), rnd(1, 6, 1, 1, seed=5)
    w1[1], b1[0, 1] = 0, 0.3  # concat channel 1: the constant 0.3; under the padded 3x3 conv it is not uniform
    w2[0] = 0  # concat channel 4 (offset 4 + 0): zero
    keep = [0, 2, 3, 5, 6]
    border = plane_conv(wc[:, [1]], [np.float32(0.3)], (5, 5), pad=1)  # the channel holds float32(0.3)
    assert border.std() > 0  # the borders differ from the interior
    expected = _concat(w1[[0, 2, 3]], b1[:, [0, 2, 3]], w2[[1, 2]], wc[:, keep], (bc + border).astype("float32"))
    check(_concat(w1, b1, w2, wc, bc), expected, rnd(1, 3, 5, 5, seed=6), removed=2)


# ---------------------------------------------------------------- depthwise conv
def _depthwise(w1, wd, bd, w2, b2):
    def body(bb, x):
        e = bb.emit(relax.op.nn.relu(bb.emit(conv(x, w1))))
        d = bb.emit(relax.op.add(bb.emit(conv(e, wd, 1, groups=wd.shape[0])), const(bd)))
        d = bb.emit(relax.op.clip(d, 0, 6))
        return relax.op.add(bb.emit(conv(d, w2)), const(b2))

    return module((1, 4, 5, 5), body)


def test_depthwise_conv_passes_a_zero_channel_and_its_bias_folds_downstream():
    w1, wd, bd = rnd(6, 4, 1, 1, seed=1), rnd(6, 1, 3, 3, seed=2), np.abs(rnd(1, 6, 1, 1, seed=3))
    w2, b2 = rnd(3, 6, 1, 1, seed=4), rnd(1, 3, 1, 1, seed=5)
    w1[3] = 0  # expand channel 3 is zero; the depthwise conv keeps it zero, its bias makes it clip(bd[3])
    keep = [0, 1, 2, 4, 5]
    folded = (b2 + min(float(bd[0, 3, 0, 0]), 6.0) * w2[:, 3].reshape(1, 3, 1, 1).astype(np.float64)).astype("float32")
    expected = _depthwise(w1[keep], wd[keep], bd[:, keep], w2[:, keep], folded)
    check(_depthwise(w1, wd, bd, w2, b2), expected, rnd(1, 4, 5, 5, seed=6), removed=2)


# ---------------------------------------------------------------- what stays
def test_channels_reaching_an_output_or_an_unknown_op_stay_and_the_module_is_returned_as_is():
    w = rnd(4, 3, 1, 1)
    w[1] = 0
    for body in (
        lambda bb, x: relax.op.nn.relu(bb.emit(conv(x, w))),  # the zero channel is a model output
        lambda bb, x: relax.op.nn.softmax(bb.emit(conv(x, w)), axis=1),  # softmax mixes channels
    ):
        before = module((1, 3, 4, 4), body)
        p = RemoveZeroChannels()
        assert p(before).same_as(before) and p.stats["zero_channels_removed"] == 0


# ---------------------------------------------------------------- through the whole pipeline, against onnxruntime
def _pruned_onnx():
    """conv+BN (two channels zeroed by BN scale and weights) -> relu -> maxpool -> depthwise -> resize,
    concat with the input, residual add, global pool, flatten, gemm: the shapes PyTorch's pruning leaves."""
    r = np.random.default_rng(0)
    w1, gamma = rnd(8, 3, 3, 3, seed=1), np.abs(rnd(8, seed=2)) + 0.5
    w1[2] = 0
    gamma[5] = 0  # a zero BN scale: its channel is BN's shift, a constant
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4),
        helper.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "wd", "bd"], ["d1"], group=8, pads=[1] * 4),
        helper.make_node("Relu", ["d1"], ["r2"]),
        helper.make_node("Resize", ["r2", "", "scales"], ["up"], mode="nearest"),
        helper.make_node("Concat", ["up", "x"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w2", "b2"], ["c2"], pads=[1] * 4),
        helper.make_node("Conv", ["r1", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c2", "c3"], ["s"]),
        helper.make_node("Relu", ["s"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "wf", "bf"], ["y"], transB=1),
    ]
    w2, w3 = rnd(6, 11, 3, 3, seed=3), rnd(6, 8, 1, 1, seed=4)
    w2[4], w3[4] = 0, 0  # channel 4 of both residual branches
    inits = {
        "w1": w1, "g": gamma.astype("float32"), "be": rnd(8, seed=5), "mu": rnd(8, seed=6) * 0.1,
        "var": np.abs(rnd(8, seed=7)) + 0.5, "wd": rnd(8, 1, 3, 3, seed=8), "bd": rnd(8, seed=9),
        "scales": np.array([1, 1, 2, 2], "float32"), "w2": w2, "b2": rnd(6, seed=10), "w3": w3,
        "b3": rnd(6, seed=11), "wf": rnd(5, 6, seed=12), "bf": rnd(5, seed=13),
    }  # fmt: skip
    inits["be"][[2, 5]], inits["mu"][[2, 5]] = -1.0, 0.0  # both relu to 0; the depthwise bias makes them constants
    return make_model(nodes, {"x": r.standard_normal((1, 3, 8, 8)).astype("float32")}, ["y"], inits)


def test_pruned_model_matches_onnxruntime_through_the_default_pipeline(tmp_path):
    m = _pruned_onnx()
    x = rnd(1, 3, 8, 8, seed=20)
    res = kiln.compile(m, tmp_path / "m.kiln")
    # channel counts the host's NCHWc block divides stay multiples of it: with 8 or 4 lanes (AVX2, NEON) the
    # 8-channel stem keeps its two dead channels (8 -> 6 would unblock it); the 6-channel residual loses one
    removed = 2 if 8 % default_caps().f32_block == 0 else 6
    assert res.report["zero_channels_removed"] == removed and res.report["zero_channel_flops_removed"] > 0
    assert not res.report["passes_skipped"]
    ours = kiln.load(tmp_path / "m.kiln").run({"x": x})["y"]
    np.testing.assert_allclose(ours, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_failing_pass_is_skipped_not_fatal(tmp_path, monkeypatch):
    def boom(func):
        raise RuntimeError("injected")

    monkeypatch.setattr(importlib.import_module("kiln.compiler.passes.remove_zero_channels"), "_Analysis", boom)
    m = _pruned_onnx()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = kiln.compile(m, tmp_path / "m.kiln", opt_level=1)
    assert [s["passes"] for s in res.report["passes_skipped"]] == [["RemoveZeroChannels"]]
    assert any("RemoveZeroChannels" in str(w.message) for w in seen)
    x = rnd(1, 3, 8, 8, seed=21)
    np.testing.assert_allclose(
        kiln.load(tmp_path / "m.kiln").run({"x": x})["y"], ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("disabled", [("RemoveZeroChannels",)])
def test_the_row_can_be_disabled(disabled):
    from kiln.compiler.backends import BACKENDS

    assert "RemoveZeroChannels" in [s.name for s in BACKENDS["cpu"].pipeline(2)]
    assert "RemoveZeroChannels" not in [s.name for s in BACKENDS["cpu"].pipeline(2, disabled)]
    assert "RemoveZeroChannels" in [s.name for s in BACKENDS["cuda"].pipeline(2)]


def test_a_zero_scale_batchnorm_after_an_activation_and_zero_input_weights_remove_their_channels(tmp_path):
    """A BatchNorm with no conv to fold into becomes x * s + t: a zero scale makes its channel the
    constant t, and what fed that channel only (the conv's output channel, through the ReLU) is dead
    and goes too. A consumer whose weights for an input channel are all zero (pruned along the input
    axis) leaves the producer's channel dead the same way."""
    r = np.random.default_rng(3)
    g = np.abs(r.standard_normal(8)).astype("float32") + 0.5
    g[[1, 6]] = 0
    w3 = r.standard_normal((5, 8, 1, 1)).astype("float32")
    w3[:, 3] = 0  # channel 3 of n1 read by nobody
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("BatchNormalization", ["r1", "g", "be", "mu", "var"], ["n1"]),
        helper.make_node("Conv", ["n1", "w2", "b2"], ["c2"], pads=[1] * 4),
        helper.make_node("Conv", ["n1", "w3"], ["c3"]),
        helper.make_node("Concat", ["c2", "c3"], ["y"], axis=1),
    ]
    inits = {
        "w1": rnd(8, 3, 3, 3, seed=1), "b1": rnd(8, seed=2), "g": g, "be": rnd(8, seed=3), "mu": rnd(8, seed=4),
        "var": np.abs(rnd(8, seed=5)) + 0.5, "w2": rnd(4, 8, 3, 3, seed=6), "b2": rnd(4, seed=7), "w3": w3,
    }  # fmt: skip
    w2 = inits["w2"]
    w2[:, 3] = 0  # both consumers ignore channel 3
    m = make_model(nodes, {"x": rnd(1, 3, 8, 8)}, ["y"], inits)
    res = kiln.compile(m, tmp_path / "m.kiln", layout="NCHW")
    assert res.report["batchnorm_to_affine"] == 1
    assert res.report["zero_channels_removed"] == 3  # conv 0's channels 1, 6 (zero BN scale) and 3 (unread)
    x = rnd(1, 3, 8, 8, seed=9)
    got = kiln.load(tmp_path / "m.kiln").run({"x": x})["y"]
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-4)
