"""decompose/: a chain of onnxruntime contrib ops whose outputs ONNX's shape inference cannot size is rewritten a
link per round (each waits for the one before to have shapes). onnxruntime's QOperator ResNet-18 (8 QLinearAdds,
QLinearGlobalAveragePool, QGemm) ran out of rounds and reached TVM with its last two contrib ops: a chain longer
than the old 8-round bound now compiles and matches onnxruntime."""

import numpy as np
import pytest
from helpers import ort_run, rand
from onnx import TensorProto, helper, numpy_helper

import kiln

LINKS = 12  # contrib ops in a chain, past the old bound of 8 rounds


def _qlinear_add_chain(links: int = LINKS):
    """x -> QuantizeLinear -> links x com.microsoft QLinearAdd (each adding a constant) -> DequantizeLinear."""
    scale, zero = np.float32(0.05), np.uint8(128)
    inits = [
        numpy_helper.from_array(np.asarray(scale), "s"),
        numpy_helper.from_array(np.asarray(zero), "z"),
        numpy_helper.from_array((np.arange(16, dtype=np.uint8) % 5 + 126).reshape(1, 16), "b"),
    ]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q0"])]
    for i in range(links):
        nodes.append(
            helper.make_node(
                "QLinearAdd", [f"q{i}", "s", "z", "b", "s", "z", "s", "z"], [f"q{i + 1}"], domain="com.microsoft"
            )
        )
    nodes.append(helper.make_node("DequantizeLinear", [f"q{links}", "s", "z"], ["y"]))
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("links", [3, LINKS])
def test_a_long_chain_of_contrib_ops_compiles_and_matches_onnxruntime(tmp_path, links):
    model = _qlinear_add_chain(links)
    kiln.compile(model, tmp_path / "m.kiln")  # with a QLinearAdd left, TVM's importer refuses the op
    x = rand(2, 16) * 2
    got = kiln.load(tmp_path / "m.kiln").run({"x": x})["y"]
    ref = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(got, ref, atol=0.05 + 1e-6)  # within one step of the 0.05 scale
