"""Every zoo model, compiled and run by Kiln, matches onnxruntime on the same input (fp32, rtol=atol=1e-4)."""

import numpy as np
import pytest
from helpers import ort_run

import kiln
from kiln import zoo


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_model_matches_onnxruntime(tmp_path, name):
    builder, shape = zoo.MODELS[name]
    model = builder()
    bn = sum(n.op_type == "BatchNormalization" for n in model.graph.node)
    assert bn > 0 or name == "transformer_encoder"
    kiln.compile(model, tmp_path / "m.kiln", input_shapes=[shape])
    m = kiln.load(tmp_path / "m.kiln")
    x = np.random.default_rng(7).standard_normal(m.inputs[0].shape).astype(np.float32)
    ours = m.run({"input": x})["output"]
    ref = ort_run(model, {"input": x})[0]
    assert ours.shape == ref.shape
    assert np.abs(ref).max() > 1e-2  # a model whose output vanished would match trivially
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


def test_zoo_is_deterministic():
    a, b = zoo.resnet18(size=32, classes=10), zoo.resnet18(size=32, classes=10)
    assert a.SerializeToString() == b.SerializeToString()
    assert zoo.resnet18(size=32, classes=10, seed=1).SerializeToString() != a.SerializeToString()


def test_batchnorm_statistics_are_not_trivial():
    from onnx import numpy_helper

    m = zoo.mobilenet_v2(size=32, classes=10)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    bn = next(n for n in m.graph.node if n.op_type == "BatchNormalization")
    gamma, beta, mean, var = (inits[i] for i in bn.input[1:])
    assert gamma.std() > 0.1 and np.abs(mean).max() > 0.01 and np.abs(var - 1).max() > 0.1 and np.abs(beta).max() > 0.01
