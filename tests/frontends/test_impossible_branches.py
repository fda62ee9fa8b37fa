"""An If whose untaken branch cannot type-check for the pinned shapes (issue 51): a VAD-like front end that
branches on its sample rate, the 8 kHz branch's Reshape -> MatMul invalid for 16 kHz frames. Kiln compiles
the other branch with a warning, matches onnxruntime on the branch the inputs take, and a run whose inputs
select the dropped branch is an InputError naming the condition's input."""

import numpy as np
import pytest
from helpers import ort_run, rand
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnWarning


def _branch(nodes, out):
    return helper.make_graph(nodes, out, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def _vad():
    """sr == 16000: frames of 128 samples -> MatMul -> mean; else 2 frames of n/2 samples -> MatMul -> max:
    the else branch is valid only for n = 256 (8 kHz), the then branch for any n divisible by 128."""
    then_g = _branch(
        [
            helper.make_node("Reshape", ["x", "s16"], ["a"]),
            helper.make_node("MatMul", ["a", "w16"], ["am"]),
            helper.make_node("ReduceMean", ["am"], ["t"], axes=[1], keepdims=0),
        ],
        "t",
    )
    else_g = _branch(
        [
            helper.make_node("Reshape", ["x", "s8"], ["b"]),
            helper.make_node("MatMul", ["b", "w8"], ["bm"]),
            helper.make_node("ReduceMax", ["bm"], ["e"], axes=[1], keepdims=0),
        ],
        "e",
    )
    nodes = [
        helper.make_node("Equal", ["sr", "k16"], ["is16"]),
        helper.make_node("If", ["is16"], ["y0"], then_branch=then_g, else_branch=else_g, name="sr_if"),
        helper.make_node("Sigmoid", ["y0"], ["y"]),
    ]
    inits = {
        "k16": np.array(16000, np.int64),
        "s16": np.array([1, -1, 128], np.int64),
        "s8": np.array([1, 2, -1], np.int64),
        "w16": rand(128, 8, seed=1),
        "w8": rand(128, 8, seed=2),
    }
    g = helper.make_graph(
        nodes,
        "vad",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_the_branch_that_cannot_run_becomes_a_run_time_error(tmp_path):
    m = _vad()
    with pytest.warns(KilnWarning, match=r"If node 'sr_if': its else branch cannot run .*reduction dimensions"):
        r = kiln.compile(m, tmp_path / "m.kiln", input_shapes=["x:1x512"])
    assert r.manifest["import_stats"]["branches_dropped"] == 1
    art = kiln.load(tmp_path / "m.kiln")
    assert [i.name for i in art.inputs] == ["x", "sr"]  # sr stays a run-time input: nothing was frozen
    sr16 = np.array(16000, np.int64)
    for seed in (3, 4):
        x = rand(1, 512, seed=seed)
        np.testing.assert_allclose(art.run({"x": x, "sr": sr16})["y"], ort_run(m, {"x": x, "sr": sr16})[0], atol=1e-5)
    with pytest.raises(kiln.InputError, match=r"`sr` selects the then branch of If node 'sr_if'") as e:
        art.run({"x": rand(1, 512), "sr": np.array(8000, np.int64)})
    assert "--input-shape" in e.value.fix and "Kiln bug" not in e.value.fix


def test_both_branches_valid_keeps_the_if(tmp_path):
    """With 8 kHz frames pinned both branches type-check: the If stays, and either sample rate matches."""
    m = _vad()
    r = kiln.compile(m, tmp_path / "m.kiln", input_shapes=["x:1x256"])
    assert "branches_dropped" not in r.manifest["import_stats"]
    art = kiln.load(tmp_path / "m.kiln")
    x = rand(1, 256, seed=5)
    for sr in (16000, 8000):
        feeds = {"x": x, "sr": np.array(sr, np.int64)}
        np.testing.assert_allclose(art.run(feeds)["y"], ort_run(m, feeds)[0], atol=1e-5)
