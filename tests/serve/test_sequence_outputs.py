"""`kiln serve` with a model whose output is an ONNX sequence: the servers speak tensors, so the sequence's
elements are served as the flat tensors the artifact lists (`parts[0]`, `parts[1]`), over V1 and V2, equal to the
elements kiln.load().run returns as a list."""

import json

import numpy as np
import pytest
from helpers import rand
from onnx import TensorProto, helper, numpy_helper
from serving import Proc

import kiln


def _split_model():
    """x [2, 6] -> SplitToSequence by [2, 4] on axis 1, each part times 2: a sequence of two tensors."""
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["y"]),
        helper.make_node("SplitToSequence", ["y", "split"], ["parts"], axis=1),
    ]
    g = helper.make_graph(
        nodes,
        "seqout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array([2, 4], np.int64), "split"),
            numpy_helper.from_array(np.float32(2), "two"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("seqout") / "seq.kiln"
    kiln.compile(_split_model(), path)
    s = Proc(path, "--name", "seq")
    yield s, kiln.load(path)
    s.stop()


def test_sequence_elements_are_served_as_tensors(served):
    server, model = served
    x = rand(2, 6)
    want = model.run({"x": x})["parts"]
    assert isinstance(want, list) and [w.shape for w in want] == [(2, 2), (2, 4)]
    assert [o.name for o in model.outputs] == ["parts[0]", "parts[1]"]

    code, _, body = server.post("/v1/models/seq:predict", json.dumps({"inputs": {"x": x.tolist()}}).encode())
    assert code == 200, body
    v1 = json.loads(body)["outputs"]
    for i, w in enumerate(want):
        np.testing.assert_allclose(np.asarray(v1[f"parts[{i}]"], np.float32), w, rtol=1e-6)

    req = {"inputs": [{"name": "x", "shape": [2, 6], "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
    code, _, body = server.post("/v2/models/seq/infer", json.dumps(req).encode())
    assert code == 200, body
    v2 = {o["name"]: o for o in json.loads(body)["outputs"]}
    for i, w in enumerate(want):
        o = v2[f"parts[{i}]"]
        assert o["shape"] == list(w.shape) and o["datatype"] == "FP32"
        np.testing.assert_allclose(np.asarray(o["data"], np.float32).reshape(w.shape), w, rtol=1e-6)
