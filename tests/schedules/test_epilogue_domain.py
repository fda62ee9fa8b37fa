"""A consumer that writes more (or less) than its anchor's output is not computed tile by tile: the
ConvTranspose -> Pad kernel left its padding border unwritten (garbage, NaNs) under the tiled rule."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import helper


@pytest.mark.parametrize("anchor", ["ConvTranspose", "Conv"])
@pytest.mark.parametrize("tail", ["pad", "crop"])
@pytest.mark.parametrize("layout", ["NCHWc", "NCHW"])
@pytest.mark.parametrize("c", [2, 16])
def test_consumer_with_another_domain(tmp_path, anchor, tail, layout, c):
    x = rand(1, c, 3, 3)
    conv = helper.make_node(anchor, ["x", "w"], ["c"], strides=[3, 2] if anchor == "ConvTranspose" else [1, 1])
    last = (
        helper.make_node("Pad", ["c", "pads"], ["y"], mode="constant")
        if tail == "pad"
        else helper.make_node("Slice", ["c", "st", "en", "ax"], ["y"])
    )
    inits = {
        "w": rand(c, c, 3, 3, seed=1) * 0.2,
        "pads": np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64),
        "st": np.array([0, 0], np.int64),
        "en": np.array([2, 1], np.int64),
        "ax": np.array([2, 3], np.int64),
    }
    m = make_model([conv, last], {"x": x}, ["y"], inits)
    for seed in range(2):
        out = check_against_ort(m, {"x": rand(1, c, 3, 3, seed=10 + seed)}, tmp_path, layout=layout)
        assert np.isfinite(out["y"]).all()
