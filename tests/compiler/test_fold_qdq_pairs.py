"""A model quantized by onnxruntime's quantize_static (QDQ, per channel) without its pre-processing, so its
BatchNorms stay apart and get Q -> DQ pairs of their own: FoldQDQPairs computes each pair between float ops as one
rounding (no uint8 round trip), the RGB stem runs on 2x2 blocks (SpaceToDepthStem), the max pool on the codes
(HoistQuantize), quantizes multiply by the reciprocal scale; the result matches onnxruntime running the same QDQ
file within a step of the output's scale."""

import numpy as np
import onnx
import pytest
from helpers import make_model, ort_run, qdq_runs_int8, rand
from onnx import helper

import kiln


def _float_net():
    """RGB -> 7x7 stride-2 conv -> BatchNorm -> ReLU -> max pool -> 3x3 conv -> BatchNorm -> ReLU (BatchNorms
    unfolded)."""
    bn = lambda i, o, p: helper.make_node("BatchNormalization", [i, f"{p}_g", f"{p}_b", f"{p}_m", f"{p}_v"], [o])
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[7, 7], pads=[3] * 4, strides=[2, 2]),
        bn("c1", "n1", "bn1"),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1] * 4),
        bn("c2", "n2", "bn2"),
        helper.make_node("Relu", ["n2"], ["y"]),
    ]
    inits = {"w1": rand(32, 3, 7, 7, seed=1) * 0.1, "w2": rand(32, 32, 3, 3, seed=2) * 0.1}
    for i, p in enumerate(("bn1", "bn2")):
        inits.update(
            {
                f"{p}_g": np.abs(rand(32, seed=10 + i)) + 0.5,
                f"{p}_b": rand(32, seed=20 + i) * 0.1,
                f"{p}_m": rand(32, seed=30 + i) * 0.1,
                f"{p}_v": np.abs(rand(32, seed=40 + i)) + 0.5,
            }
        )
    return make_model(nodes, {"x": rand(1, 3, 32, 32)}, ["y"], inits)


def _ort_qdq(tmp_path) -> onnx.ModelProto:
    q = pytest.importorskip("onnxruntime.quantization")

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": rand(1, 3, 32, 32, seed=100 + i)} for i in range(8)])

        def get_next(self):
            return next(self.it, None)

    onnx.save(_float_net(), tmp_path / "f.onnx")
    q.quantize_static(
        str(tmp_path / "f.onnx"),
        str(tmp_path / "q.onnx"),
        Reader(),
        quant_format=q.QuantFormat.QDQ,
        per_channel=True,
        activation_type=q.QuantType.QUInt8,
        weight_type=q.QuantType.QInt8,
    )
    return onnx.load(tmp_path / "q.onnx")


def test_onnxruntime_qdq_model(tmp_path):
    m = _ort_qdq(tmp_path)
    assert sum(n.op_type == "BatchNormalization" for n in m.graph.node) == 2  # kept apart, with Q -> DQ after
    r = kiln.compile(m, tmp_path / "q.kiln")
    int8 = qdq_runs_int8()  # the QDQ stem then runs int8, on 2x2 blocks
    assert r.report["qdq_pairs_folded"] >= 2 and r.report.get("space_to_depth_stems", 0) == int8
    assert r.report.get("quantizes_hoisted", 0) == int8  # the max pool runs on the codes (HoistQuantize)
    x = rand(1, 3, 32, 32, seed=7)
    ref = ort_run(m, {"x": x})[0]
    got = kiln.load(tmp_path / "q.kiln").run({"x": x})["y"]
    scale = _output_scale(m)
    assert np.abs(got - ref).max() <= 2 * scale + 1e-6, (np.abs(got - ref).max(), scale)
    assert (np.abs(got - ref) > 0.5 * scale).mean() < 0.01  # nearly every value on onnxruntime's own step


def _output_scale(m) -> float:
    """The scale of the QuantizeLinear that writes the graph's output's codes (the last one)."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    q = [n for n in m.graph.node if n.op_type == "QuantizeLinear"][-1]
    return float(inits[q.input[1]])


def test_the_pair_is_one_rounding():
    """The fold's arithmetic: clip(round(x / s), lo - zp, hi - zp) * s is DQ(Q(x)) for every x."""
    x = np.linspace(-20, 20, 100001, dtype=np.float32)
    s, zp = np.float32(0.0731), 37
    dq = (np.clip(np.round(x / s) + zp, 0, 255) - zp) * s
    folded = np.clip(np.round(x * (np.float32(1) / s)), -zp, 255 - zp) * s
    assert (dq != folded).mean() < 1e-3  # only values on a rounding boundary may move, by one step
    assert np.abs(dq - folded).max() <= s * 1.0001
