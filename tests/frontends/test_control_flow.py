"""Control flow real exporters write: an If on computed data (relax.If, run by TVM's VM), an If on
an input the deployer knows (--freeze-input folds it away), and a Loop whose trip count is data refused by name."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import TensorProto, helper

import kiln
from kiln.frontends.preflight import find_unsupported_ops


def _branch(nodes, out):
    return helper.make_graph(nodes, out, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def _data_if_model():
    """conv -> If(mean(conv) > 0: relu(conv) * 2, else: sigmoid(conv)) -> conv: the condition is data."""
    x = rand(1, 3, 8, 8)
    then_g = _branch([helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Mul", ["r", "two"], ["t"])], "t")
    else_g = _branch([helper.make_node("Sigmoid", ["c"], ["e"])], "e")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y0"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Conv", ["y0", "w2"], ["y"]),
    ]
    inits = {
        "w": rand(8, 3, 3, 3, seed=1) * 0.3,
        "b": rand(8, seed=2),
        "w2": rand(4, 8, 1, 1, seed=3) * 0.3,
        "two": np.float32(2),
        "zero": np.float32(0),
    }
    return make_model(nodes, {"x": x}, ["y"], inits)


def test_if_on_computed_data_takes_either_branch(tmp_path):
    m = _data_if_model()
    assert find_unsupported_ops(m) == []
    x = rand(1, 3, 8, 8, seed=7)
    outs = [check_against_ort(m, {"x": s * x}, tmp_path) for s in (1.0, -1.0, 40.0)]
    assert not np.allclose(outs[0]["y"], -outs[1]["y"])  # the branches differ, and each matched onnxruntime


def _sample_rate_model():
    """A voice-activity-style front end: If sr == 16000 then frame by 4 else by 2 (different shapes)."""
    x = rand(1, 64)
    then_g = _branch(
        [
            helper.make_node("Reshape", ["x", "s16"], ["a"]),
            helper.make_node("ReduceMean", ["a"], ["t"], axes=[2], keepdims=0),
        ],
        "t",
    )
    else_g = _branch(
        [
            helper.make_node("Reshape", ["x", "s8"], ["b"]),
            helper.make_node("ReduceMax", ["b"], ["e"], axes=[2], keepdims=0),
        ],
        "e",
    )
    nodes = [
        helper.make_node("Equal", ["sr", "k16"], ["is16"]),
        helper.make_node("If", ["is16"], ["y0"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Relu", ["y0"], ["y"]),
    ]
    inits = {
        "k16": np.array(16000, np.int64),
        "s16": np.array([1, 16, 4], np.int64),
        "s8": np.array([1, 32, 2], np.int64),
    }
    g = helper.make_graph(
        nodes,
        "vad",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), x


@pytest.mark.parametrize("sr", [16000, 8000])
def test_freeze_input_folds_the_if_away(tmp_path, sr):
    from helpers import ort_run

    m, x = _sample_rate_model()
    r = kiln.compile(m, tmp_path / "m.kiln", freeze_inputs=[f"sr={sr}"])
    assert r.report["ops_before"].get("If", 0) == 0 and r.manifest["import_stats"]["ifs_inlined"] == 1
    assert r.manifest["compile_options"]["freeze_inputs"] == {"sr": sr}
    art = kiln.load(tmp_path / "m.kiln")
    assert [i.name for i in art.inputs] == ["x"]  # the frozen input is no longer fed
    ref = ort_run(m, {"x": x, "sr": np.array(sr, np.int64)})[0]
    np.testing.assert_allclose(art.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-6)


def test_freeze_input_cli_and_bad_values(tmp_path):
    m, x = _sample_rate_model()
    onnx.save(m, tmp_path / "vad.onnx")
    cmd = [sys.executable, "-m", "kiln.cli", "compile", str(tmp_path / "vad.onnx"), "-o", str(tmp_path / "v.kiln")]
    ok = subprocess.run(cmd + ["--freeze-input", "sr=8000"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(cmd + ["--freeze-input", "rate=8000"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown input(s) ['rate']" in bad.stderr and "'x', 'sr'" in bad.stderr
    frac = subprocess.run(cmd + ["--freeze-input", "sr=8000.5"], capture_output=True, text=True)
    assert frac.returncode == 2 and "does not fit its type int64" in frac.stderr
    with pytest.raises(kiln.OptionsError, match="NAME=VALUE"):
        kiln.compile(m, tmp_path / "x.kiln", freeze_inputs=["sr"])
    with pytest.raises(kiln.OptionsError, match="both frozen and given a shape"):
        kiln.compile(m, tmp_path / "x.kiln", freeze_inputs={"x": [0.0] * 64}, input_shapes=["x:1x64"])
    assert not (tmp_path / "x.kiln").exists()


def _data_loop_model():
    """A Loop whose trip count is an input's value (data): its iteration count is known only at run time."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 3]),
        ],
    )
    nodes = [helper.make_node("Loop", ["n", "t", "x"], ["y"], body=body)]
    return make_model(
        nodes, {"x": rand(1, 3), "n": np.array(3, np.int64)}, ["y"], {"t": np.array(True), "one": np.float32(1)}
    )


def test_loop_with_a_data_trip_count_is_refused_by_name(tmp_path):
    # a Loop with a constant trip count is unrolled (tests/frontends/test_unrolled_control_flow.py)
    m = _data_loop_model()
    with pytest.raises(kiln.UnsupportedModelError, match="Loop has a trip count 'n' computed from data") as e:
        kiln.compile(m, tmp_path / "m.kiln")
    assert "--freeze-input" in str(e.value)
    assert not (tmp_path / "m.kiln").exists()


def _tv(name, shape=None):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_nested_if_reads_a_local_of_the_inlined_branch(tmp_path):
    # both conditions are constant once the shape is pinned; the inner branch reads the outer branch's local 't'
    # (silero-vad's decoder: KeyError in TVM's importer when inlining renamed 't' but not the inner reads)
    inner_then = _branch([helper.make_node("Neg", ["t"], ["it"])], "it")
    inner_else = _branch([helper.make_node("Abs", ["t"], ["ie"])], "ie")
    outer_then = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["t"]),
            helper.make_node("If", ["c"], ["o1"], then_branch=inner_then, else_branch=inner_else),
        ],
        "ot",
        [],
        [_tv("o1")],
    )
    outer_else = _branch([helper.make_node("Sigmoid", ["x"], ["oe"])], "oe")
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ReduceProd", ["s"], ["n"], keepdims=0),
        helper.make_node("Greater", ["n", "two"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=outer_then, else_branch=outer_else),
    ]
    m = make_model(nodes, {"x": rand(2, 3)}, ["y"], {"two": np.array(2, np.int64)}, in_shapes={"x": ["N", 3]})
    out = check_against_ort(m, {"x": rand(2, 3, seed=3)}, tmp_path, input_shapes=["x:2x3"])
    np.testing.assert_allclose(out["y"], -np.maximum(rand(2, 3, seed=3), 0), rtol=1e-6)


def test_data_dependent_if_branches_are_folded_and_decomposed(tmp_path):
    # the then branch pads by an amount computed from the input's shape (folded inside the branch), the else
    # branch runs an LSTM (decomposed inside the branch): both were left to TVM, which refused them
    h, t = 3, 6
    r = np.random.default_rng(0)
    then_g = _branch(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Slice", ["s", "i2", "i3"], ["w"]),
            helper.make_node("Mod", ["w", "four"], ["rem"]),
            helper.make_node("Concat", ["z5", "rem"], ["pads"], axis=0),
            helper.make_node("Pad", ["x", "pads"], ["p"]),
            helper.make_node("ReduceMean", ["p"], ["t_out"], axes=[2], keepdims=1),
        ],
        "t_out",
    )
    else_g = _branch(
        [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[2, 0, 1]),
            helper.make_node("LSTM", ["xt", "W", "R"], ["", "yh"], hidden_size=h),
            helper.make_node("Transpose", ["yh"], ["e_out"], perm=[1, 2, 0]),
        ],
        "e_out",
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
        helper.make_node("Greater", ["sum", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    inits = {
        "i2": np.array([2], np.int64),
        "i3": np.array([3], np.int64),
        "four": np.array([4], np.int64),
        "z5": np.zeros(5, np.int64),
        "zero": np.float32(0),
        "W": r.standard_normal((1, 4 * h, 4)).astype(np.float32),
        "R": r.standard_normal((1, 4 * h, h)).astype(np.float32),
    }
    m = make_model(nodes, {"x": rand(1, 4, t)}, ["y"], inits, opset=13)
    x = np.abs(rand(1, 4, t, seed=5))
    assert check_against_ort(m, {"x": x}, tmp_path)["y"].shape == (1, 4, 1)
    assert check_against_ort(m, {"x": -x}, tmp_path)["y"].shape == (1, h, 1)


def test_if_branches_sharing_a_planned_storage_run(tmp_path, monkeypatch):
    """TVM's StaticPlanBlockMemory gave this If's branches one storage token, allocated in the then branch only:
    the else branch segfaulted on its first run (seen when PropagateBlockedLayout moved the condition's mean onto
    the blocked conv output, which both branches read). executable.relax_pipeline keeps such a function
    unplanned; every branch matches onnxruntime."""
    from tvm import relax

    import kiln.compiler.passes.propagate_blocked_layout as pbl

    monkeypatch.setitem(pbl.REDUCE, "relax.mean", relax.op.mean)  # the layout that made TVM's planner share
    m = _data_if_model()
    x = rand(1, 3, 8, 8, seed=7)
    outs = [check_against_ort(m, {"x": s * x}, tmp_path) for s in (1.0, -1.0, 40.0, -1.0)]
    assert not np.allclose(outs[0]["y"], outs[1]["y"])
