"""Test helpers: build one-node ONNX models, compile them with Kiln and compare with onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln

NP2ONNX = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("int64"): TensorProto.INT64,
           np.dtype("int32"): TensorProto.INT32, np.dtype("bool"): TensorProto.BOOL}


def make_model(nodes, inputs: dict, outputs: list[str], inits: dict | None = None, opset: int = 17,
               in_shapes: dict | None = None) -> onnx.ModelProto:
    """inputs: name -> example array (its dtype and, unless in_shapes overrides, its shape)."""
    in_shapes = in_shapes or {}
    g = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, NP2ONNX[a.dtype], in_shapes.get(n, list(a.shape))) for n, a in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(m)  # fills in the output types onnxruntime requires


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def compile_and_run(model, feeds: dict, tmp_path, input_shapes=None, **kw) -> dict[str, np.ndarray]:
    path = tmp_path / "m.kiln"
    kiln.compile(model, path, input_shapes=input_shapes, **kw)
    return kiln.load(path).run(feeds)


def check_against_ort(model, feeds: dict, tmp_path, input_shapes=None, rtol=1e-4, atol=1e-4, **kw) -> dict:
    ours = compile_and_run(model, feeds, tmp_path, input_shapes, **kw)
    refs = ort_run(model, feeds)
    names = [o.name for o in model.graph.output]
    assert list(ours) == names
    for name, ref in zip(names, refs):
        assert ours[name].shape == ref.shape, (name, ours[name].shape, ref.shape)
        assert ours[name].dtype == ref.dtype, (name, ours[name].dtype, ref.dtype)
        np.testing.assert_allclose(ours[name], ref, rtol=rtol, atol=atol, err_msg=name)
    return ours


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
