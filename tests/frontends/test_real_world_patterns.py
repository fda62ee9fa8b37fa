"""Patterns real exporters write that TVM 0.27's importer rejects on its own: run-time shape
arithmetic, computed pads, constant-condition If, wrong declared output shapes, LSTM and GRU."""

import numpy as np
import pytest
from helpers import check_against_ort, compile_and_run, make_model, rand
from onnx import TensorProto, helper

import kiln


def test_shape_gather_concat_reshape(tmp_path):
    # PyTorch's x.view(x.size(0), -1), with a symbolic batch pinned at compile time
    x = rand(2, 4, 3, 3)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    m = make_model(
        nodes,
        {"x": x},
        ["y"],
        {"zero": np.array(0, np.int64), "ax0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)},
        in_shapes={"x": ["N", 4, 3, 3]},
    )
    check_against_ort(m, {"x": x}, tmp_path, input_shapes=["x:2x4x3x3"])


def test_computed_pads(tmp_path):
    # pads computed from the input size at run time ("Dynamic pads are not supported yet" in TVM)
    x = rand(1, 2, 5, 7)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "two", "four"], ["hw"]),
        helper.make_node("Mod", ["hw", "two"], ["odd"]),
        helper.make_node("Concat", ["zeros2", "zeros2", "zeros2", "odd"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant"),
    ]
    m = make_model(
        nodes,
        {"x": x},
        ["y"],
        {"two": np.array([2], np.int64), "four": np.array([4], np.int64), "zeros2": np.zeros(2, np.int64)},
        in_shapes={"x": [1, 2, "H", "W"]},
    )
    out = check_against_ort(m, {"x": x}, tmp_path, input_shapes=["x:1x2x5x7"])
    assert out["y"].shape == (1, 2, 6, 8)


def test_if_with_constant_condition_is_inlined(tmp_path):
    x = rand(1, 3, 4, 4)
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Equal", ["n", "one"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    m = make_model(
        nodes,
        {"x": x},
        ["y"],
        {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)},
        in_shapes={"x": ["N", 3, 4, 4]},
    )
    out = check_against_ort(m, {"x": x}, tmp_path, input_shapes=["x:1x3x4x4"])
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))


def test_wrong_declared_output_shape_is_ignored(tmp_path):
    x = rand(2, 3)
    m = make_model([helper.make_node("Transpose", ["x"], ["y"])], {"x": x}, ["y"])
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 99  # an exporter's lie
    ours = kiln.compile(m, tmp_path / "m.kiln").manifest["outputs"]
    assert ours[0]["shape"] == [3, 2]


def _rnn_model(op, T, B, I, H, direction, seed, layout=0, with_states=True, **attrs):
    nd = 2 if direction == "bidirectional" else 1
    g = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    r = np.random.default_rng(seed)
    w = lambda *s: (r.standard_normal(s) * 0.4).astype(np.float32)
    inits = {"W": w(nd, g * H, I), "R": w(nd, g * H, H), "B": w(nd, 2 * g * H)}
    x = rand(*((B, T, I) if layout else (T, B, I)), seed=seed + 1)
    feeds = {"x": x}
    ins = ["x", "W", "R", "B", ""]
    if with_states:
        hs = (B, nd, H) if layout else (nd, B, H)
        feeds["h0"] = rand(*hs, seed=seed + 2)
        ins.append("h0")
        if op == "LSTM":
            feeds["c0"] = rand(*hs, seed=seed + 3)
            ins.append("c0")
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ins, outs, hidden_size=H, direction=direction, layout=layout, **attrs)
    return make_model([node], feeds, outs, inits), feeds


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm(tmp_path, direction):
    m, feeds = _rnn_model("LSTM", T=5, B=2, I=6, H=8, direction=direction, seed=1)
    check_against_ort(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def _add_peepholes(m, H):
    p = np.random.default_rng(9).standard_normal(3 * H).astype(np.float32)
    m.graph.initializer.append(helper.make_tensor("P", TensorProto.FLOAT, [1, 3 * H], p))
    node = m.graph.node[0]
    node.input.extend([""] * (7 - len(node.input)) + ["P"])


def test_lstm_clip_peepholes_no_states(tmp_path):
    m, feeds = _rnn_model("LSTM", T=4, B=3, I=5, H=6, direction="forward", seed=2, with_states=False, clip=2.0)
    _add_peepholes(m, 6)
    check_against_ort(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_lstm_batch_first(tmp_path):
    # onnxruntime refuses layout=1 ("Batchwise recurrent operations are not supported"): ONNX's
    # reference evaluator is the reference here (it handles `clip` differently from onnxruntime, so no clip)
    from onnx.reference import ReferenceEvaluator

    m, feeds = _rnn_model("LSTM", T=4, B=3, I=5, H=6, direction="bidirectional", seed=2, layout=1)
    _add_peepholes(m, 6)
    m.graph.initializer[-1].CopyFrom(
        helper.make_tensor(
            "P", TensorProto.FLOAT, [2, 18], np.random.default_rng(9).standard_normal(36).astype(np.float32)
        )
    )
    refs = ReferenceEvaluator(m).run(None, feeds)
    ours = compile_and_run(m, feeds, tmp_path)
    assert ours["Y"].shape == (3, 4, 2, 6) and ours["Y_h"].shape == (3, 2, 6)
    for (name, got), ref in zip(ours.items(), refs):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("direction,lbr", [("forward", 0), ("forward", 1), ("bidirectional", 0), ("reverse", 1)])
def test_gru(tmp_path, direction, lbr):
    m, feeds = _rnn_model("GRU", T=5, B=2, I=6, H=8, direction=direction, seed=3, linear_before_reset=lbr)
    check_against_ort(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_rnn_with_variable_sequence_lens_masks_the_padding(tmp_path):
    # each step is masked past a batch entry's length (the spec's padding semantics), see decompose/rnn.py
    m, feeds = _rnn_model("GRU", T=5, B=2, I=6, H=8, direction="forward", seed=4, with_states=False)
    m.graph.initializer.append(helper.make_tensor("lens", TensorProto.INT32, [2], [5, 3]))
    m.graph.node[0].input[4] = "lens"
    check_against_ort(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def _recurrence_kernels(model) -> tuple[int, int]:
    """(one-kernel recurrences, all kernels) in the compile report."""
    from kiln.compiler.build import analyze_model

    report = analyze_model(model)
    return report["recurrence_kernels"], report["kernels"]


@pytest.mark.parametrize("op,direction", [("LSTM", "bidirectional"), ("GRU", "forward"), ("RNN", "reverse")])
def test_recurrence_is_one_kernel(tmp_path, op, direction):
    # 20 steps unrolled were 4-6 kernels a step; the layer is one kernel, its input projection one more
    # (and the state's and outputs' transposes where a direction needs them)
    m, feeds = _rnn_model(op, T=20, B=1, I=6, H=16, direction=direction, seed=5)
    one, total = _recurrence_kernels(m)
    assert one == 1 and total <= 6, (one, total)
    check_against_ort(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_recurrence_with_clip_is_unrolled_and_right(tmp_path):
    # the kernel has the default activations and no clip: such a layer keeps the per-step ops
    m, feeds = _rnn_model("GRU", T=4, B=2, I=5, H=6, direction="forward", seed=6, clip=0.5)
    assert _recurrence_kernels(m)[0] == 0
    check_against_ort(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["GRU", "RNN"])
def test_batch_first_recurrence_in_one_kernel(tmp_path, op):
    from onnx.reference import ReferenceEvaluator

    m, feeds = _rnn_model(op, T=4, B=3, I=5, H=6, direction="bidirectional", seed=7, layout=1)
    assert _recurrence_kernels(m)[0] == 1
    refs = ReferenceEvaluator(m).run(None, feeds)
    ours = compile_and_run(m, feeds, tmp_path)
    assert ours["Y"].shape == (3, 4, 2, 6) and ours["Y_h"].shape == (3, 2, 6)
    for (name, got), ref in zip(ours.items(), refs):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=name)
