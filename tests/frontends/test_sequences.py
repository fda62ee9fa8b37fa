"""ONNX sequences and optionals of static length (frontends/sequences.py, sequence_io.py): sequence graph
inputs and outputs as lists, the sequence ops, SequenceMap, Loop and If around sequences, optionals present,
absent or decided at run time; each against onnxruntime. A length that depends on data is refused by name."""

import numpy as np
import pytest
from helpers import ort_run, rand
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontends.shapes import InputShape, parse_input_shapes

F = TensorProto.FLOAT


def _seq(name, elem=F, dims=None):
    return helper.make_tensor_sequence_value_info(name, elem, dims)


def _model(nodes, inputs, outputs, inits=None, opset=18):
    g = helper.make_graph(
        nodes, "seq", inputs, outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _same(ours, ref):
    if isinstance(ref, list):
        assert isinstance(ours, list) and len(ours) == len(ref), (ours, ref)
        for a, b in zip(ours, ref):
            _same(a, b)
    elif ref is None:
        assert ours is None
    else:
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, (ours.shape, ref.shape, ours.dtype, ref.dtype)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def _check(model, feeds_list, tmp_path, **kw):
    kiln.compile(model, tmp_path / "m.kiln", **kw)
    m = kiln.load(tmp_path / "m.kiln")
    names = [o.name for o in model.graph.output]
    for feeds in feeds_list:
        ours = m.run(feeds)
        assert list(ours) == names
        for name, ref in zip(names, ort_run(model, feeds)):
            _same(ours[name], ref)
    return m


def test_sequence_ops_on_a_sequence_input(tmp_path):
    """A sequence in, SequenceInsert/Erase/At/Length/ConcatFromSequence, a sequence out."""
    nodes = [
        helper.make_node("SequenceInsert", ["xs", "t", "one"], ["s1"]),
        helper.make_node("SequenceErase", ["s1"], ["s2"]),  # the last one
        helper.make_node("SequenceAt", ["s2", "minus1"], ["last"]),
        helper.make_node("SequenceLength", ["s1"], ["n"]),
        helper.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=0),
        helper.make_node("ConcatFromSequence", ["s2"], ["stack"], axis=1, new_axis=1),
    ]
    outs = [_seq("s2"), helper.make_tensor_value_info("last", F, None)]
    outs += [helper.make_tensor_value_info(n, t, None) for n, t in (("n", TensorProto.INT64), ("cat", F), ("stack", F))]
    m = _model(
        nodes,
        [_seq("xs", F, [2, 3]), helper.make_tensor_value_info("t", F, [2, 3])],
        outs,
        {"one": np.array(1, np.int64), "minus1": np.array(-1, np.int64)},
    )
    feeds = {"xs": [rand(2, 3, seed=i) for i in range(3)], "t": rand(2, 3, seed=9)}
    art = _check(m, [feeds], tmp_path, input_shapes={"xs": [(2, 3)] * 3})
    assert art.manifest["io_structure"]["inputs"]["xs"] == {"sequence": ["xs[0]", "xs[1]", "xs[2]"]}
    assert [s.name for s in art.inputs] == ["xs[0]", "xs[1]", "xs[2]", "t"]


def test_sequence_map_over_elements_of_different_shapes(tmp_path):
    """SequenceMap unrolled over the pinned length: each element its own shape, a tensor input shared."""
    body = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Shape", ["a"], ["shape"])],
        "body",
        [helper.make_tensor_value_info("a", F, ["n"]), helper.make_tensor_value_info("b", F, [1])],
        [helper.make_tensor_value_info("s", F, ["n"]), helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
    )
    m = _model(
        [helper.make_node("SequenceMap", ["xs", "b"], ["ys", "shapes"], body=body)],
        [_seq("xs", F, ["n"]), helper.make_tensor_value_info("b", F, [1])],
        [_seq("ys"), _seq("shapes", TensorProto.INT64)],
    )
    feeds = {"xs": [rand(4), rand(1, seed=1), rand(6, seed=2)], "b": rand(1, seed=3)}
    _check(m, [feeds], tmp_path, input_shapes={"xs": "[4,1,6]"})


def test_split_to_sequence_with_run_time_sizes(tmp_path):
    """A split of static length fed at run time: as many elements as it has, their lengths from the data."""
    m = _model(
        [helper.make_node("SplitToSequence", ["x", "split"], ["parts"], axis=1)],
        [helper.make_tensor_value_info("x", F, [2, 6]), helper.make_tensor_value_info("split", TensorProto.INT64, [2])],
        [_seq("parts")],
    )
    x = rand(2, 6)
    _check(m, [{"x": x, "split": np.array(s, np.int64)} for s in ([2, 4], [5, 1])], tmp_path)


def _optional_if():
    """If cond: an empty optional, else the optional of a sequence [x + 1, x * 2]."""
    then_g = helper.make_graph(
        [
            helper.make_node(
                "Optional", [], ["e"], type=helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [3]))
            )
        ],
        "then",
        [],
        [
            helper.make_value_info(
                "e",
                helper.make_optional_type_proto(helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [3]))),
            )
        ],
    )
    else_g = helper.make_graph(
        [
            helper.make_node("Add", ["x", "one"], ["a"]),
            helper.make_node("Mul", ["x", "two"], ["b"]),
            helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
            helper.make_node("Optional", ["s"], ["o"]),
        ],
        "else",
        [],
        [
            helper.make_value_info(
                "o",
                helper.make_optional_type_proto(helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [3]))),
            )
        ],
    )
    out = helper.make_value_info(
        "y", helper.make_optional_type_proto(helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [3])))
    )
    return _model(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [3])],
        [out],
        {"one": np.float32(1), "two": np.float32(2)},
    )


def test_if_on_data_returns_an_optional_sequence(tmp_path):
    m = _optional_if()
    x = rand(3)
    art = _check(m, [{"cond": np.array(c), "x": x} for c in (False, True)], tmp_path)
    assert art.run({"cond": np.array(True), "x": x})["y"] is None


def _loop_model(trip):
    """A Loop appending x[:i+1] to a sequence it carries, trip times (trip: a constant or a graph input)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Add", ["i", "one"], ["end"]),
            helper.make_node("Unsqueeze", ["end", "zero1"], ["end1"]),
            helper.make_node("Slice", ["x", "zero1", "end1"], ["part"]),
            helper.make_node("SequenceInsert", ["s_in", "part"], ["s_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            _seq("s_in"),
        ],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), _seq("s_out")],
    )
    inits = {"one": np.array(1, np.int64), "zero1": np.array([0], np.int64), "true": np.array(True)}
    inputs = [helper.make_tensor_value_info("x", F, [4])]
    if trip is None:
        inputs.append(helper.make_tensor_value_info("n", TensorProto.INT64, []))
    else:
        inits["n"] = np.array(trip, np.int64)
    nodes = [
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
        helper.make_node("Loop", ["n", "true", "empty"], ["s"], body=body),
    ]
    return _model(nodes, inputs, [_seq("s")], inits)


def test_loop_carrying_a_sequence_is_unrolled(tmp_path):
    _check(_loop_model(3), [{"x": rand(4)}], tmp_path)


def test_a_data_dependent_length_is_refused_by_name_and_frozen(tmp_path):
    m = _loop_model(None)
    with pytest.raises(kiln.UnsupportedModelError, match="computed from data") as e:
        kiln.compile(m, tmp_path / "m.kiln")
    assert "--freeze-input n=" in str(e.value) and e.value.ops[0]["sources"] == ["n"]
    kiln.compile(m, tmp_path / "f.kiln", freeze_inputs={"n": 2})
    x = rand(4)
    _same(kiln.load(tmp_path / "f.kiln").run({"x": x})["s"], ort_run(m, {"x": x, "n": np.array(2, np.int64)})[0])


def test_a_sequence_input_must_be_pinned():
    m = _model([helper.make_node("Identity", ["xs"], ["ys"])], [_seq("xs", F, ["n"])], [_seq("ys")])
    with pytest.raises(kiln.ShapeError, match=r"--input-shape xs:\["):
        kiln.compile(m, "/nonexistent/m.kiln")


def test_sequence_shape_specs_parse():
    assert parse_input_shapes(["xs:[2x3,4]", "e:[]", "s:[()]", "o:none"]) == {
        "xs": ((2, 3), (4,)),
        "e": (),
        "s": ((),),
        "o": None,
    }
    assert str(InputShape.parse("xs:[2x3,()]")) == "xs:[2x3,()]"
    assert parse_input_shapes({"xs": [(1,), (2, 2)], "t": [1, 3]}) == {"xs": ((1,), (2, 2)), "t": (1, 3)}
