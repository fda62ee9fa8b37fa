"""SubsampleStridedPointwise: a strided 1x1 conv reads a strided slice of its input, exactly; other convs are
left alone. Numerics against onnxruntime (float) or the exact integer result (a QDQ model's int8 conv)."""

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.compiler.passes import SubsampleStridedPointwise
from kiln.frontends.importer import import_onnx
from tests.helpers import check_against_ort, make_model, qdq_conv, rand


def _conv(cin, cout, hw, strides, pads=(0, 0, 0, 0), group=1, k=1):
    """ReLU -> Conv(k x k, strides, pads, group) + bias -> ReLU: the conv reads a computed tensor, as in a model."""
    nodes = [
        helper.make_node("Relu", ["input"], ["r"]),
        helper.make_node("Conv", ["r", "w", "b"], ["c"], strides=list(strides), pads=list(pads), group=group),
        helper.make_node("Relu", ["c"], ["output"]),
    ]
    inits = {"w": rand(cout, cin // group, k, k, seed=1) * 0.2, "b": rand(cout, seed=2)}
    return make_model(nodes, {"input": rand(1, cin, *hw)}, ["output"], inits), rand(1, cin, *hw, seed=3)


def _subsampled(model) -> int:
    p = SubsampleStridedPointwise()
    p(import_onnx(model).mod)
    return p.stats["strided_pointwise_subsampled"]


@pytest.mark.parametrize(
    "cin,cout,hw,strides,group",
    [
        (32, 64, (14, 14), (2, 2), 1),  # ResNet's downsample shortcut
        (16, 24, (7, 9), (2, 2), 1),  # odd map: 4x5 outputs, the last row and column read
        (16, 16, (8, 11), (2, 1), 1),  # stride along H only
        (16, 32, (9, 9), (3, 3), 4),  # stride 3, grouped
    ],
)
def test_strided_pointwise_matches_onnxruntime(tmp_path, cin, cout, hw, strides, group):
    model, x = _conv(cin, cout, hw, strides, group=group)
    assert _subsampled(model) == 1
    check_against_ort(model, {"input": x}, tmp_path)


@pytest.mark.parametrize(
    "kw", [{"strides": (1, 1)}, {"strides": (2, 2), "pads": (1, 1, 1, 1)}, {"strides": (2, 2), "k": 3}]
)
def test_other_convs_are_left_alone(tmp_path, kw):
    """Stride 1, a padded strided 1x1 (it reads padding too) and a 3x3: nothing to slice."""
    model, x = _conv(16, 16, (10, 10), **kw)
    assert _subsampled(model) == 0
    check_against_ort(model, {"input": x}, tmp_path)


def test_qdq_int8_strided_pointwise_is_exact(tmp_path):
    """A QDQ model's stride-2 1x1 conv (LowerQDQ makes it uint8 x int8 first): the slice is of its uint8 input,
    and the int8 result is the exact integer one."""
    model, x, ref = qdq_conv(cin=32, cout=48, k=1, stride=2, pad=0, zx=7, hw=15)
    r = kiln.compile(model, tmp_path / "m.kiln")
    assert r.report["strided_pointwise_subsampled"] == 1
    np.testing.assert_allclose(kiln.load(tmp_path / "m.kiln").run({"input": x})["output"], ref, rtol=1e-5, atol=1e-5)
