"""Loop and Scan unrolled with static trip counts (decompose/control_flow.py), recurrent ops with
weights fed as graph inputs and data sequence_lens (decompose/rnn.py), checked against onnxruntime;
SplitToSequence written as tensors; Loops whose iteration count depends on data stay refused by name."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import TensorProto, helper

import kiln

F = TensorProto.FLOAT


def _vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def test_rnn_with_weights_as_inputs_and_data_sequence_lens(tmp_path):
    T, B, I, H = 4, 3, 2, 5
    r = np.random.default_rng(0)
    feeds = {
        "x": rand(T, B, I, seed=1),
        "W": r.standard_normal((2, H, I)).astype(np.float32),
        "R": (r.standard_normal((2, H, H)) * 0.5).astype(np.float32),
        "B": r.standard_normal((2, 2 * H)).astype(np.float32),
        "lens": np.array([4, 2, 1], np.int32),
    }
    node = helper.make_node(
        "RNN",
        ["x", "W", "R", "B", "lens"],
        ["Y", "Y_h"],
        hidden_size=H,
        direction="bidirectional",
        activations=["Tanh", "Relu"],
        clip=2.0,
    )
    check_against_ort(make_model([node], feeds, ["Y", "Y_h"]), feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_loop_with_constant_trip_count_nested_if_and_outer_values(tmp_path):
    # body: h = v + w (w from the outer graph); an If on data inside reads the body's h; scan output per step
    then_g = helper.make_graph([helper.make_node("Relu", ["h"], ["t"])], "then", [], [_vi("t", None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "else", [], [_vi("e", None)])
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "w"], ["h"]),
            helper.make_node("If", ["pos"], ["g"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["g", "fi"], ["v_out"]),
            helper.make_node("Identity", ["h"], ["scan"]),
        ],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("v_in", [2, 3])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", [2, 3]), _vi("scan", [2, 3])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["pos"]),
        helper.make_node("Loop", ["n", "", "x"], ["y", "ys"], body=body),
    ]
    feeds = {"x": rand(2, 3, seed=3)}
    m = make_model(
        nodes, feeds, ["y", "ys"], {"n": np.array(3, np.int64), "w": rand(2, 3, seed=4), "zero": np.float32(0)}
    )
    out = check_against_ort(m, feeds, tmp_path)
    assert out["ys"].shape == (3, 2, 3)


def test_scan_reversed_input_output_axis_and_gru_in_the_body(tmp_path):
    # two scan inputs (one read backwards), outputs stacked on axis 1; a GRU in the body is rewritten after unrolling
    B, I, H = 2, 3, 4
    r = np.random.default_rng(5)
    W, R = r.standard_normal((1, 3 * H, I)).astype(np.float32), r.standard_normal((1, 3 * H, H)).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["ab"]),
            helper.make_node("Unsqueeze", ["ab", "ax0"], ["x3"]),
            helper.make_node("Unsqueeze", ["s_in", "ax0"], ["h0"]),
            helper.make_node("GRU", ["x3", "W", "R", "", "", "h0"], ["", "hn"], hidden_size=H),
            helper.make_node("Squeeze", ["hn", "ax0"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "two"], ["o"]),
        ],
        "body",
        [_vi("s_in", [B, H]), _vi("a", [B, I]), _vi("b", [B, I])],
        [_vi("s_out", [B, H]), _vi("o", [B, H])],
    )
    node = helper.make_node(
        "Scan",
        ["s0", "xa", "xb"],
        ["s", "os"],
        num_scan_inputs=2,
        body=body,
        scan_input_directions=[0, 1],
        scan_input_axes=[0, 1],
        scan_output_axes=[1],
    )
    feeds = {"s0": rand(B, H, seed=6), "xa": rand(5, B, I, seed=7), "xb": rand(B, 5, I, seed=8)}
    m = make_model([node], feeds, ["s", "os"], {"W": W, "R": R, "two": np.float32(2), "ax0": np.array([0], np.int64)})
    out = check_against_ort(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)
    assert out["os"].shape == (B, 5, H)


def test_loop_whose_condition_is_computed_in_the_body_is_refused(tmp_path):
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
            helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
            helper.make_node("Less", ["s", "ten"], ["cond_out"]),
        ],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("v_in", [3])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", [3])],
    )
    feeds = {"x": rand(3)}
    m = make_model(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
        feeds,
        ["y"],
        {"n": np.array(5, np.int64), "one": np.float32(1), "ten": np.float32(10)},
    )
    with pytest.raises(kiln.UnsupportedModelError, match="Loop whose condition is computed in its body"):
        kiln.compile(m, tmp_path / "m.kiln")


def test_split_to_sequence_uneven_chunks_as_tensors(tmp_path):
    # chunk size 4 of a 6-wide axis: chunks of 4 and 2 (TVM's own converter asks for equal sections)
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sp"], ["seq"], axis=1),
        helper.make_node("SequenceAt", ["seq", "last"], ["a"]),
        helper.make_node("SequenceLength", ["seq"], ["n"]),
        helper.make_node("ConcatFromSequence", ["seq"], ["c"], axis=1),
    ]
    feeds = {"x": rand(3, 6)}
    m = make_model(nodes, feeds, ["a", "n", "c"], {"sp": np.array(4, np.int64), "last": np.array(-1, np.int64)})
    out = check_against_ort(m, feeds, tmp_path)
    assert out["a"].shape == (3, 2) and int(out["n"]) == 2


def test_split_to_sequence_with_a_data_split_is_refused(tmp_path):
    feeds = {"x": rand(3, 6), "sp": np.array(2, np.int64)}
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sp"], ["seq"], axis=1),
        helper.make_node("ConcatFromSequence", ["seq"], ["c"], axis=0),
    ]
    with pytest.raises(kiln.UnsupportedModelError, match="SplitToSequence's split 'sp' is computed from data"):
        kiln.compile(make_model(nodes, feeds, ["c"]), tmp_path / "m.kiln")


def test_loop_in_a_loop_with_an_rnn_reading_the_inner_loop(tmp_path):
    # the inner Loop is unrolled in a second round, the RNN on its result in a third (shapes inferred again)
    inner = helper.make_graph(
        [helper.make_node("Identity", ["ci"], ["co"]), helper.make_node("Add", ["a_in", "x"], ["a_out"])],
        "inner",
        [_vi("j", [], TensorProto.INT64), _vi("ci", [], TensorProto.BOOL), _vi("a_in", [2])],
        [_vi("co", [], TensorProto.BOOL), _vi("a_out", [2])],
    )
    outer = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Loop", ["two", "", "v_in"], ["v_out"], body=inner),
            helper.make_node("Unsqueeze", ["v_out", "ax"], ["v3"]),
            helper.make_node("Unsqueeze", ["v3", "ax"], ["v4"]),
            helper.make_node("RNN", ["v4", "W", "R"], ["", "hn"], hidden_size=3),
        ],
        "outer",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("v_in", [2])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", [2]), _vi("hn", None)],
    )
    feeds = {"x": rand(2, seed=9)}
    m = make_model(
        [helper.make_node("Loop", ["three", "", "x"], ["y", "hs"], body=outer)],
        feeds,
        ["y", "hs"],
        {
            "three": np.array(3, np.int64),
            "two": np.array(2, np.int64),
            "ax": np.array([0], np.int64),
            "W": rand(1, 3, 2, seed=10),
            "R": rand(1, 3, 3, seed=11),
        },
    )
    out = check_against_ort(m, feeds, tmp_path)
    assert out["hs"].shape == (3, 1, 1, 3)
