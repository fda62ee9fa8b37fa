"""ResizeAsMatmul: a bilinear Resize of a small map runs as a matmul (columns) and a two-row lerp kernel
(rows) and gives onnxruntime's numbers for the coordinate modes exporters write (torchvision's segmentation
heads: half_pixel; align_corners=True: align_corners; TF: asymmetric; pytorch_half_pixel), non-square maps
and a scale per axis. (Resizes by non-integer scales already arrive as matmuls: the ONNX frontend's
decomposition, standard_spatial.py.)"""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import helper

from kiln.compiler.ir import calls
from kiln.compiler.passes import ResizeAsMatmul
from kiln.compiler.passes.resize_as_matmul import interpolation_matrix
from kiln.frontends.importer import import_onnx

pytestmark = pytest.mark.filterwarnings("error::kiln.errors.KilnWarning")  # a failed optional pass is skipped


def _model(shape, out_hw, mode="half_pixel", method="linear"):
    x = rand(*shape)
    nodes = [
        helper.make_node(
            "Resize", ["input", "", "", "sizes"], ["output"], mode=method, coordinate_transformation_mode=mode
        )
    ]
    inits = {"sizes": np.array([shape[0], shape[1], *out_hw], np.int64)}
    return make_model(nodes, {"input": x}, ["output"], inits, opset=13), x


@pytest.mark.parametrize(
    "shape,out_hw,mode",
    [
        ((1, 21, 14, 14), (224, 224), "half_pixel"),  # DeepLabV3's logits at 224
        ((1, 21, 28, 28), (224, 224), "half_pixel"),  # LRASPP's
        ((2, 8, 9, 13), (18, 39), "half_pixel"),  # batch 2, non-square, different scales per axis
        ((1, 8, 10, 10), (30, 20), "align_corners"),
        ((1, 8, 10, 10), (40, 20), "asymmetric"),
        ((1, 8, 10, 10), (20, 40), "pytorch_half_pixel"),
    ],
)
def test_bilinear_resize_matches_onnxruntime(tmp_path, shape, out_hw, mode):
    model, x = _model(shape, out_hw, mode)
    p = ResizeAsMatmul()
    mod = p(import_onnx(model).mod)
    assert p.stats["resize_as_matmul"] == 1
    ops = [getattr(c.op, "name", "") for c in calls(mod["main"])]
    assert ops.count("relax.matmul") == 1 and ops.count("relax.call_tir") == 1  # columns, then the rows' kernel
    assert "resize_rows" in [gv.name_hint for gv in mod.functions]
    check_against_ort(model, {"input": x}, tmp_path, rtol=1e-4, atol=1e-5)


def test_large_maps_and_nearest_stay_topi():
    for model, _ in (_model((1, 3, 80, 80), (160, 160)), _model((1, 8, 10, 10), (20, 20), "asymmetric", "nearest")):
        p = ResizeAsMatmul()
        p(import_onnx(model).mod)
        assert p.stats["resize_as_matmul"] == 0


def test_interpolation_rows_sum_to_one_and_clamp_at_the_edges():
    m = interpolation_matrix(4, 8, "half_pixel")
    np.testing.assert_allclose(m.sum(axis=1), 1.0, rtol=1e-6)
    assert m[0, 0] == 1.0 and m[-1, -1] == 1.0  # coordinates -0.25 and 3.25 clamp to the edge pixels
    np.testing.assert_allclose(m[1], [0.75, 0.25, 0, 0])  # coordinate 0.25
