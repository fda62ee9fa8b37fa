"""What a graph may take and return at its boundary: 0-d inputs stay 0-d, a model with no inputs runs,
an empty constant in a Concat is dropped, and sequences at the boundary are refused by name."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model
from onnx import TensorProto, helper

import kiln


def test_scalar_input_stays_scalar(tmp_path):
    x = np.array(3.0, np.float32)
    m = make_model([helper.make_node("Neg", ["x"], ["y"])], {"x": x}, ["y"])
    assert check_against_ort(m, {"x": x}, tmp_path)["y"].shape == ()


def test_model_without_inputs(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1, 2]))],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    kiln.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "c.kiln")
    np.testing.assert_array_equal(kiln.load(tmp_path / "c.kiln").run({})["y"], [1, 2])


def test_concat_with_an_empty_constant(tmp_path):
    x = np.ones((2, 4, 3), np.float32)
    m = make_model(
        [helper.make_node("Concat", ["e", "x"], ["y"], axis=2)], {"x": x}, ["y"], {"e": np.zeros((2, 4, 0), np.float32)}
    )
    check_against_ort(m, {"x": x}, tmp_path)


def test_sequence_at_the_boundary_needs_its_length_and_a_static_position(tmp_path):
    """A sequence input is compiled for a pinned length (tests/frontends/test_sequences.py); a SequenceAt whose
    position is fed at run time picks an element of a shape known only then: refused naming the input (elements
    of one shape are stacked and gathered)."""
    g = helper.make_graph(
        [helper.make_node("SequenceAt", ["s", "i"], ["y"])],
        "g",
        [
            helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(kiln.ShapeError, match=r"input 's' is a sequence: its length and element shapes"):
        kiln.compile(m, tmp_path / "s.kiln")
    with pytest.raises(kiln.UnsupportedModelError, match="position 'i' is computed from data") as e:
        kiln.compile(m, tmp_path / "s.kiln", input_shapes={"s": "[2,3]"})
    assert e.value.ops[0]["sources"] == ["i"]
    kiln.compile(m, tmp_path / "t.kiln", input_shapes={"s": "[2,2,2]"})
    a, b, c = (np.full(2, v, np.float32) for v in (1, 2, 3))
    for i in (0, 2, -1):
        np.testing.assert_array_equal(
            kiln.load(tmp_path / "t.kiln").run({"s": [a, b, c], "i": np.array(i)})["y"], [a, b, c][i]
        )
