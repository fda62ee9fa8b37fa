"""Sequence and optional inputs and outputs at run time (kiln/runtime/structure.py): lists in and out, None
for an absent optional, and clear InputErrors for a list of the wrong length or a None where a value was
compiled."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import InputError
from kiln.runtime.structure import Structure

ENTRY = {
    "inputs": {
        "xs": {"sequence": ["xs[0]", "xs[1]"]},
        "o": {"optional": None, "present": False},
        "p": {"optional": "p.value", "present": True},
    },
    "outputs": [
        ["ys", {"sequence": ["ys[0]", "ys[1]"]}],
        ["maybe", {"optional": {"sequence": ["maybe.value[0]"]}, "present": "maybe?"}],
        ["t", "t"],
    ],
}


def test_feeds_and_results_flatten_and_rebuild():
    s = Structure(ENTRY, "m.kiln")
    a, b, p, t = np.zeros(2), np.ones(2), np.full(3, 2.0), np.arange(3)
    assert s.flatten({"xs": [a, b], "o": None, "p": p, "t": t}) == {"t": t, "xs[0]": a, "xs[1]": b, "p.value": p}
    flat = {"ys[0]": a, "ys[1]": b, "maybe?": np.array(False), "maybe.value[0]": p, "t": t}
    assert s.unflatten(flat) == {"ys": [a, b], "maybe": None, "t": t}
    out = s.unflatten(dict(flat, **{"maybe?": np.array(True)}))
    assert out["maybe"] == [p]


@pytest.mark.parametrize(
    "feed, match",
    [
        ({"xs": [np.zeros(2)], "o": None, "p": np.zeros(3)}, "compiled for 2 element"),
        ({"xs": np.zeros(2), "o": None, "p": np.zeros(3)}, "pass a list of 2 arrays"),
        ({"xs": [np.zeros(2)] * 2, "o": np.zeros(1), "p": np.zeros(3)}, "compiled as absent"),
        ({"xs": [np.zeros(2)] * 2, "o": None, "p": None}, "compiled as present"),
    ],
)
def test_wrong_structures_are_input_errors(feed, match):
    with pytest.raises(InputError, match=match):
        Structure(ENTRY, "m.kiln").flatten(feed)


def test_an_absent_optional_input_runs_as_none(tmp_path):
    """An optional input compiled absent (`o:none`): fed None, OptionalHasElement is false, the output None."""
    opt = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    g = helper.make_graph(
        [
            helper.make_node("OptionalHasElement", ["o"], ["has"]),
            helper.make_node("Identity", ["o"], ["o_out"]),
            helper.make_node("Add", ["x", "x"], ["y"]),
        ],
        "opt",
        [helper.make_value_info("o", opt), helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [
            helper.make_tensor_value_info("has", TensorProto.BOOL, []),
            helper.make_value_info("o_out", opt),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    kiln.compile(m, tmp_path / "m.kiln", input_shapes=["o:none"])
    art = kiln.load(tmp_path / "m.kiln")
    x = np.array([1.0, 2.0], np.float32)
    out = art.run({"o": None, "x": x})
    assert out["has"] == np.array(False) and out["o_out"] is None
    np.testing.assert_array_equal(out["y"], 2 * x)
    with pytest.raises(InputError, match="compiled as absent"):
        art.run({"o": x, "x": x})
