"""Round and QuantizeLinear legalize to tirx.round (ties to even, like ONNX) and vectorize: topi's
te.nearbyint has no TVectorizable in TVM 0.27, so its loop stayed scalar and LLVM vectorized the loop
around it with gathers (ResNet-50 int8's quantize kernels at 13 GB/s). The kernel's assembly:
tests/schedules/test_rules.py::test_blocked_quantize_is_vectorized_without_gathers."""

import numpy as np
from helpers import check_against_ort, make_model
from onnx import helper


def _ties(shape, seed=0):
    """Values with many exact .5 ties (both signs), where half-to-even and half-away differ."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-40, 40, shape) + 0.5 * rng.integers(0, 2, shape)).astype(np.float32)


def test_round_and_quantize_match_onnxruntime_on_ties(tmp_path):
    x = _ties((1, 32, 8, 16))
    nodes = [
        helper.make_node("Round", ["x"], ["r"]),
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
    ]
    m = make_model(nodes, {"x": x}, ["r", "q"], {"s": np.float32(0.5), "z": np.uint8(128)}, opset=13)
    out = check_against_ort(m, {"x": x}, tmp_path, rtol=0, atol=0)
    assert np.array_equal(out["r"], np.round(x))  # numpy rounds half to even too
