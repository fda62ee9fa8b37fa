"""Kiln's ONNX converters are installed into TVM's converter map for one import at a time, and only for the
thread that imports (tvm_converters.kiln_converters): two compiles in two threads both succeed and match
onnxruntime, and a thread using TVM's importer meanwhile sees TVM's own map."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from helpers import check_against_ort, make_model, rand
from onnx import helper

from kiln.frontends import tvm_converters


def _slice_model():
    """Slice to INT64_MAX ("no limit"), which Kiln's Slice converter clamps (TVM's rejects the literal)."""
    x = rand(2, 6, 5)
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inits = {"starts": np.array([1], np.int64), "ends": np.array([2**63 - 1], np.int64)}
    inits["axes"] = np.array([1], np.int64)
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def _topk_model():
    """TopK with a constant k, then a MatMul: another set of converters, one of them Kiln's (TopK)."""
    x = rand(3, 8, seed=1)
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
        helper.make_node("MatMul", ["v", "w"], ["y"]),
    ]
    inits = {"k": np.array([4], np.int64), "w": rand(4, 5, seed=2)}
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def test_two_threads_compile_different_models_at_once(tmp_path):
    from tvm.relax.frontend.onnx import onnx_frontend as f

    tvms = f._get_convert_map
    models = [_slice_model(), _topk_model()]
    start = threading.Barrier(len(models))

    def compile_one(i):
        model, feeds = models[i]
        (tmp_path / str(i)).mkdir()
        start.wait()  # both compiles begin together, so their imports contend for TVM's converter map
        return check_against_ort(model, feeds, tmp_path / str(i))

    with ThreadPoolExecutor(len(models)) as pool:
        results = list(pool.map(compile_one, range(len(models))))
    assert [list(r) for r in results] == [["y"], ["y"]]
    assert f._get_convert_map is tvms  # an interleaved save/restore would leave one compile's map installed


def test_the_override_is_this_threads_and_ends_with_the_import():
    from tvm.relax.frontend.onnx import onnx_frontend as f

    tvms = f._get_convert_map
    seen = {}
    with tvm_converters.kiln_converters():
        ours = f._get_convert_map()
        other = threading.Thread(target=lambda: seen.update(f._get_convert_map()))
        other.start()
        other.join()
    assert type(ours["Slice"]).__name__ == "_Shaped"  # Kiln's wrapper, in the importing thread
    assert seen["Slice"] is tvms()["Slice"]  # TVM's own converter class, in any other thread
    assert f._get_convert_map is tvms
