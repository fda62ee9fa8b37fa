"""kiln prune: channels tied by a residual add go together in every branch, the shrunk model equals
the zeroed one (onnxruntime) and Kiln's build of the zeroed one (RemoveZeroChannels), per-layer
budgets, --keep, --criterion bn-scale, the accuracy gate (nothing written on failure), the CLI, and
the bad-input errors."""

import numpy as np
import onnx
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln
from kiln.cli import main
from kiln.errors import AccuracyError, OptionsError, UnsupportedModelError
from kiln.prune import prune_model
from kiln.prune.graph import ChannelGraph
from kiln.prune.select import choose


def _bn(nodes, inits, x, c, name, seed):
    inits.update({f"{name}_g": np.abs(rand(c, seed=seed)) + 0.2, f"{name}_b": rand(c, seed=seed + 1) * 0.1})
    inits.update({f"{name}_m": rand(c, seed=seed + 2) * 0.1, f"{name}_v": np.abs(rand(c, seed=seed + 3)) + 0.5})
    nodes.append(helper.make_node("BatchNormalization", [x] + [f"{name}_{k}" for k in "gbmv"], [f"{name}_y"]))
    return f"{name}_y"


def _conv(nodes, inits, x, cin, cout, name, seed, k=3, group=1, relu=True):
    inits[f"{name}_w"] = rand(cout, cin // group, k, k, seed=seed) * 0.4
    nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_c"], name=name, pads=[k // 2] * 4, group=group))
    y = _bn(nodes, inits, f"{name}_c", cout, f"{name}_bn", seed + 10)
    if relu:
        nodes.append(helper.make_node("Relu", [y], [f"{name}_r"]))
        y = f"{name}_r"
    return y


def small_net(out="logits"):
    """stem -> residual block (add) -> two branches concatenated -> depthwise -> pool -> flatten -> gemm."""
    nodes, inits = [], {}
    s = _conv(nodes, inits, "x", 3, 8, "stem", 1)
    a = _conv(nodes, inits, s, 8, 8, "res_a", 20)
    b = _conv(nodes, inits, a, 8, 8, "res_b", 40, relu=False)
    nodes += [helper.make_node("Add", [b, s], ["sum"]), helper.make_node("Relu", ["sum"], ["blk"])]
    p = _conv(nodes, inits, "blk", 8, 6, "br_p", 60, k=1)
    q = _conv(nodes, inits, "blk", 8, 4, "br_q", 80)
    nodes.append(helper.make_node("Concat", [p, q], ["cat"], axis=1))
    d = _conv(nodes, inits, "cat", 10, 10, "dw", 100, group=10)
    e = _conv(nodes, inits, d, 10, 12, "proj", 120, k=1)
    if out == "features":
        return make_model(nodes, {"x": rand(1, 3, 8, 8)}, [e], inits)
    nodes += [
        helper.make_node("MaxPool", [e], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
    ]
    inits.update({"fc_w": rand(10, 12 * 16, seed=200) * 0.1, "fc_b": rand(10, seed=201)})
    return make_model(nodes, {"x": rand(1, 3, 8, 8)}, ["logits"], inits)


def _calibration(tmp_path, n=8):
    path = tmp_path / "calib.npz"
    np.savez(path, x=np.random.default_rng(3).standard_normal((n, 3, 8, 8)).astype("float32"))
    return path


def test_residual_branches_lose_the_same_channels():
    g = ChannelGraph(small_net())
    removed, info = choose(g, 0.3, "l1")
    # the add ties the stem's output, branch b's BN output, the sum and its ReLU: one choice for all
    tied = ["stem_r", "res_b_bn_y", "sum", "blk"]
    assert len(removed["stem_r"]) == 2  # floor(0.3 * 8)
    for t in tied:
        np.testing.assert_array_equal(removed[t], removed["stem_r"])
    # concat offsets: channel c of br_q is channel 6 + c of the concat and of the depthwise conv
    cat = set(removed["cat"].tolist())
    assert cat == set(removed["br_p_r"].tolist()) | {6 + c for c in removed["br_q_r"].tolist()}
    np.testing.assert_array_equal(removed["dw_c"], removed["cat"])
    assert "logits" not in removed and info["classes"] > 0


def test_shrunk_equals_zeroed_in_onnxruntime_and_in_kiln(tmp_path):
    m = small_net()
    pruned, report = prune_model(m, 0.3, multiple=1)
    zeroed, _ = prune_model(m, 0.3, zero_only=True, multiple=1)
    assert [i.name for i in pruned.graph.input] == ["x"] and [o.name for o in pruned.graph.output] == ["logits"]
    assert pruned.ByteSize() < m.ByteSize() and report["flops_after"] < 0.75 * report["flops_before"]
    for layer in report["layers"]:
        before, after = layer["channels"]
        assert before - after <= int(0.3 * before) and after >= 1, layer
    x = rand(1, 3, 8, 8, seed=9)
    ref = ort_run(pruned, {"x": x})[0]
    np.testing.assert_allclose(ort_run(zeroed, {"x": x})[0], ref, rtol=1e-5, atol=1e-5)
    # NCHW: no channel block to keep (with NCHWc, counts the host's block divides stay multiples of it)
    res = kiln.compile(zeroed, tmp_path / "z.kiln", layout="NCHW")
    assert res.report["zero_channel_flops_removed"] == report["flops_before"] - report["flops_after"]
    np.testing.assert_allclose(kiln.load(tmp_path / "z.kiln").run({"x": x})["logits"], ref, rtol=1e-4, atol=1e-4)


def test_channel_counts_stay_multiples():
    g = ChannelGraph(small_net())
    removed, _ = choose(g, 0.5, "l1", multiple=4)
    for t, ok in g.ties.ok.items():
        c, kept = len(ok), len(ok) - len(removed.get(t, ()))
        assert kept >= 1 and (c % 4 or kept % 4 == 0), (t, c, kept)
    assert len(removed["stem_r"]) == 4 and len(removed["proj_c"]) == 4  # 8 -> 4, 12 -> 8


def test_keep_and_bn_scale():
    m = small_net()
    g = [i for i in m.graph.initializer if i.name == "br_p_bn_g"][0]
    gamma = onnx.numpy_helper.to_array(g).copy()
    gamma[[1, 4]] = 1e-4  # network slimming removes the channels BN scales down
    g.CopyFrom(onnx.numpy_helper.from_array(gamma, g.name))
    removed, info = choose(ChannelGraph(m), 0.34, "bn-scale")
    assert set(removed["br_p_r"].tolist()) == {1, 4} and info["criterion_fallback"] == ["fc"]
    removed, _ = choose(ChannelGraph(m), 0.3, "l1", keep=("res_b",))
    assert "stem_r" not in removed and "res_b_c" not in removed  # the whole residual group stays
    assert len(removed["res_a_c"]) == 2


def test_accuracy_report_and_gate_writes_nothing(tmp_path):
    m = small_net(out="features")
    calib = _calibration(tmp_path)
    _, report = prune_model(m, 0.3, calibration=calib, multiple=1)
    acc = report["accuracy"]
    assert acc["samples"] == 8 and 0 < acc["outputs"]["proj_r"]["cosine"] < 1 and acc["worst_layers"]
    with pytest.raises(AccuracyError, match="pruned model agreement .* below --min-agreement 0.99999.*largest error"):
        prune_model(m, 0.5, calibration=calib, min_agreement=0.99999, multiple=1)
    onnx.save(m, tmp_path / "m.onnx")
    argv = ["prune", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "p.onnx"), "--ratio", "0.5", "--multiple", "1"]
    assert main(argv + ["--calibration", str(calib), "--min-agreement", "0.99999"]) == 2
    assert not (tmp_path / "p.onnx").exists()
    assert main(argv + ["--report", str(tmp_path / "r.json")]) == 0
    assert onnx.load(tmp_path / "p.onnx").graph.output[0].name == "proj_r" and (tmp_path / "r.json").exists()


@pytest.mark.parametrize("ratio", [0, 1, 1.5, -0.2])
def test_ratio_outside_the_open_interval(ratio):
    with pytest.raises(OptionsError, match=rf"--ratio: ratio {ratio!r} is outside \(0, 1\)"):
        prune_model(small_net(), ratio)


def test_bad_inputs_name_the_value_and_the_valid_ones(tmp_path):
    with pytest.raises(OptionsError, match=r"--keep: no layer named 'nope' -> layers are: .*br_p.*stem"):
        prune_model(small_net(), 0.3, keep=("nope",))
    with pytest.raises(OptionsError, match="--criterion: criterion 'l3' is not known -> use l1, l2, bn-scale"):
        prune_model(small_net(), 0.3, criterion="l3")
    with pytest.raises(OptionsError, match="--min-agreement needs data"):
        prune_model(small_net(), 0.3, min_agreement=0.9)
    lone = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Softmax", ["x"], ["z"], axis=1)],
        {"x": rand(1, 3, 4, 4)},
        ["y", "z"],
        {"w": rand(4, 3, 1, 1)},
    )
    with pytest.raises(UnsupportedModelError, match="no prunable conv: 1 Conv node"):
        prune_model(lone, 0.3)
