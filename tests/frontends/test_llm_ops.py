"""The LLM-era ops of opsets 24-27 (decompose/llm_ops.py) against onnxruntime: LinearAttention's unrolled
recurrence (GQA, per-head decay, past state), TensorScatter's data write offsets (wrapping in circular mode),
CausalConvWithState with k = 1 (an empty present_state) and with a past state, bias and SiLU, and BitCast bit-exact
on specials, subnormals and negative int64."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from tests.helpers import check_against_ort, compile_and_run, make_model, rand

OPSET = 27


def test_linear_attention_gated_delta_gqa_with_past_state(tmp_path):
    b, t, hq, hkv, dk, dv = 2, 3, 4, 2, 4, 3
    feeds = {
        "q": rand(b, t, hq * dk, seed=1),
        "k": rand(b, t, hkv * dk, seed=2) * 0.5,
        "v": rand(b, t, hkv * dv, seed=3),
        "past": rand(b, hkv, dk, dv, seed=4),
        "decay": -np.abs(rand(b, t, hkv, seed=5)),  # one decay per head
        "beta": 1 / (1 + np.exp(-rand(b, t, hkv, seed=6))),
    }
    node = helper.make_node(
        "LinearAttention",
        ["q", "k", "v", "past", "decay", "beta"],
        ["y", "state"],
        q_num_heads=hq,
        kv_num_heads=hkv,
        scale=0.3,
    )
    check_against_ort(make_model([node], feeds, ["y", "state"], opset=OPSET), feeds, tmp_path)


def test_linear_attention_linear_rule_no_past(tmp_path):
    feeds = {"q": rand(1, 2, 8, seed=1), "k": rand(1, 2, 8, seed=2), "v": rand(1, 2, 4, seed=3)}
    node = helper.make_node(
        "LinearAttention", ["q", "k", "v"], ["y", "state"], q_num_heads=2, kv_num_heads=2, update_rule="linear"
    )
    check_against_ort(make_model([node], feeds, ["y", "state"], opset=OPSET), feeds, tmp_path)


def test_linear_attention_too_long_to_unroll_is_refused_by_name(tmp_path):
    feeds = {n: rand(1, 600, 4) for n in ("q", "k", "v")}
    node = helper.make_node(
        "LinearAttention", ["q", "k", "v"], ["y", "state"], q_num_heads=1, kv_num_heads=1, update_rule="linear"
    )
    with pytest.raises(kiln.UnsupportedModelError, match="LinearAttention"):
        kiln.compile(make_model([node], feeds, ["y", "state"], opset=OPSET), tmp_path / "m.kiln")


@pytest.mark.parametrize("mode,writes", [("circular", [3, 1]), ("linear", [0, 2])])
def test_tensor_scatter_data_write_indices(tmp_path, mode, writes):
    feeds = {"cache": rand(2, 3, 5, 4, seed=1), "update": rand(2, 3, 3, 4, seed=2), "w": np.array(writes, np.int64)}
    node = helper.make_node("TensorScatter", ["cache", "update", "w"], ["y"], mode=mode, axis=2)
    check_against_ort(make_model([node], feeds, ["y"], opset=OPSET), feeds, tmp_path, rtol=0, atol=0)


@pytest.mark.filterwarnings("error::kiln.errors.KilnWarning")  # its empty state kernel once took DefaultSchedules off
def test_causal_conv_kernel_one_and_silu_with_past_state(tmp_path):
    feeds = {
        "x": rand(2, 3, 5, seed=1),
        "w1": rand(3, 1, 1, seed=2),
        "w3": rand(3, 1, 3, seed=3),
        "bias": rand(3, seed=4),
        "past": rand(2, 3, 2, seed=5),
    }
    nodes = [
        helper.make_node("CausalConvWithState", ["x", "w1"], ["y1", "s1"]),
        helper.make_node("CausalConvWithState", ["x", "w3", "bias", "past"], ["y3", "s3"], activation="silu"),
    ]
    check_against_ort(make_model(nodes, feeds, ["y1", "s1", "y3", "s3"], opset=OPSET), feeds, tmp_path)


def test_bitcast_is_exact_on_specials_subnormals_and_negative_int64(tmp_path):
    f32 = np.array(
        [
            1.0,
            -2.5,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            1e-45,
            1.1754942e-38,
            3.4028235e38,
            2.0**-20,
            np.nextafter(np.float32(8), np.float32(0)),
        ],
        np.float32,
    )
    i64 = np.array([4607182418800017408, -4611686018427387904, -1, np.iinfo(np.int64).min, 1], np.int64)
    i8 = np.array([-1, -128, 127, 0], np.int8)
    feeds = {"f": f32, "i": i64, "b": i8}
    types = {"f": TensorProto.FLOAT, "i": TensorProto.INT64, "b": TensorProto.INT8}
    nodes = [
        helper.make_node("BitCast", ["f"], ["fi"], to=TensorProto.INT32),
        helper.make_node("BitCast", ["fi"], ["ff"], to=TensorProto.FLOAT),
        helper.make_node("BitCast", ["i"], ["id"], to=TensorProto.DOUBLE),
        helper.make_node("BitCast", ["id"], ["ii"], to=TensorProto.INT64),
        helper.make_node("BitCast", ["b"], ["bu"], to=TensorProto.UINT8),
    ]
    g = helper.make_graph(
        nodes,
        "bitcast",
        [helper.make_tensor_value_info(n, types[n], list(a.shape)) for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in ("fi", "ff", "id", "ii", "bu")],
    )
    out = compile_and_run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 26)]), feeds, tmp_path)
    np.testing.assert_array_equal(out["fi"], f32.view(np.int32))
    np.testing.assert_array_equal(out["ff"].view(np.int32), f32.view(np.int32))
    np.testing.assert_array_equal(out["id"].view(np.int64)[[0, 1, 3, 4]], i64[[0, 1, 3, 4]])  # -1 is a NaN
    np.testing.assert_array_equal(out["ii"][[0, 1, 3, 4]], i64[[0, 1, 3, 4]])
    np.testing.assert_array_equal(out["bu"], i8.view(np.uint8))
