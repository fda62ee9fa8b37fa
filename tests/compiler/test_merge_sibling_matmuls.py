"""MergeSiblingMatmuls: matmuls of one tensor by different constant weights (a transformer's Q, K and V
projections) become one matmul and a slice each, biases merged when each matmul has its own. The zoo encoder
merged and matching onnxruntime with fewer kernels; a matmul result the graph also returns; the cases that
must not merge (a matmul by a run-time tensor, another input) left alone."""

import numpy as np
from helpers import check_against_ort, make_model, rand
from onnx import helper

import kiln
from kiln import zoo

N = helper.make_node


def _siblings(biases=(True, True, True), widths=(32, 32, 48), k=24, extra_output=False):
    """x [2, 5, k] times three constant weights (optionally each + its bias), summed after per-branch ops."""
    nodes, inits, outs = [], {}, []
    for i, (w, b) in enumerate(zip(widths, biases)):
        inits[f"w{i}"] = rand(k, w, seed=i + 1)
        nodes.append(N("MatMul", ["x", f"w{i}"], [f"m{i}"]))
        out = f"m{i}"
        if b:
            inits[f"b{i}"] = rand(w, seed=i + 10)
            nodes.append(N("Add", [out, f"b{i}"], [f"a{i}"]))
            out = f"a{i}"
        nodes.append(N("Relu" if i % 2 else "Sigmoid", [out], [f"y{i}"]))
        outs.append(f"y{i}")
    if extra_output:
        outs.append("m0")  # a matmul result the graph returns too: its bias cannot join the merged one
    return make_model(nodes, {"x": rand(2, 5, k)}, outs, inits)


def test_zoo_encoder_merges_qkv(tmp_path):
    model = zoo.transformer_encoder(seq=16, batch=1)
    x = {"input": rand(1, 16, 128, seed=3)}
    merged = kiln.compile(model, tmp_path / "a.kiln", input_shapes=["input:1x16x128"])
    apart = kiln.compile(
        model, tmp_path / "b.kiln", input_shapes=["input:1x16x128"], disabled_passes=["MergeSiblingMatmuls"]
    )
    assert merged.report["matmul_groups"] == 2 and merged.report["matmuls_merged"] == 4  # Q, K, V per layer
    assert apart.report.get("matmul_groups", 0) == 0
    assert merged.report["kernels"] == apart.report["kernels"] - 4  # two matmuls fewer a layer, the slices fused
    check_against_ort(model, x, tmp_path, input_shapes=["input:1x16x128"], rtol=1e-4, atol=1e-4)


def test_biases_merged_and_branches_keep_their_ops(tmp_path):
    r = kiln.compile(_siblings(), tmp_path / "m.kiln")
    assert r.report["matmuls_merged"] == 2 and r.report["matmul_groups"] == 1
    check_against_ort(_siblings(), {"x": rand(2, 5, 24, seed=7)}, tmp_path)


def test_some_without_bias_merge_the_matmuls_only(tmp_path):
    model = _siblings(biases=(True, False, True))
    assert kiln.compile(model, tmp_path / "m.kiln").report["matmuls_merged"] == 2
    check_against_ort(model, {"x": rand(2, 5, 24, seed=8)}, tmp_path)


def test_returned_matmul_keeps_the_biases_apart(tmp_path):
    model = _siblings(extra_output=True)
    r = kiln.compile(model, tmp_path / "m.kiln")
    assert r.report["matmuls_merged"] == 2  # the matmuls merge; the biases follow the slices
    check_against_ort(model, {"x": rand(2, 5, 24, seed=9)}, tmp_path)


def test_run_time_weights_and_other_inputs_stay_apart(tmp_path):
    nodes = [
        N("MatMul", ["x", "w0"], ["m0"]),
        N("MatMul", ["x", "y"], ["m1"]),  # weights known only at run time
        N("MatMul", ["z", "w1"], ["m2"]),  # another input
        N("Concat", ["m0", "m1", "m2"], ["out"], axis=-1),
    ]
    feeds = {"x": rand(4, 8), "y": rand(8, 16, seed=1), "z": rand(4, 8, seed=2)}
    model = make_model(nodes, feeds, ["out"], {"w0": rand(8, 16, seed=3), "w1": rand(8, 16, seed=4)})
    assert kiln.compile(model, tmp_path / "m.kiln").report["matmul_groups"] == 0
    out = check_against_ort(model, feeds, tmp_path)["out"]
    np.testing.assert_allclose(out[:, 16:32], feeds["x"] @ feeds["y"], rtol=1e-4, atol=1e-5)
