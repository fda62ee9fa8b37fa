"""Col2Im with image_shape and block_shape fed at run time (issue 51): compiled without --freeze-input, the
channel and image dims symbolic, each run matching onnxruntime (a float32 scatter-add of the same terms:
rtol 1e-5, atol 1e-5) for several shapes fed to the same compiled model."""

import numpy as np
import pytest
from helpers import make_model, ort_run
from onnx import helper

import kiln


@pytest.mark.parametrize(
    "attrs, runs",
    [
        ({}, [([4, 5], [2, 2]), ([3, 6], [1, 3]), ([12, 1], [1, 1])]),  # C = 3, 4 and 12 channels
        (
            {"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]},
            [([5, 4], [2, 2]), ([3, 2], [1, 1]), ([5, 6], [2, 3])],
        ),
    ],
)
def test_col2im_with_run_time_shapes(tmp_path, attrs, runs):
    def columns(img, blk):
        return int(
            np.prod(
                [
                    (
                        i
                        + attrs.get("pads", [0] * 4)[d]
                        + attrs.get("pads", [0] * 4)[d + 2]
                        - attrs.get("dilations", [1, 1])[d] * (b - 1)
                        - 1
                    )
                    // attrs.get("strides", [1, 1])[d]
                    + 1
                    for d, (i, b) in enumerate(zip(img, blk))
                ]
            )
        )

    ck, cols = 12, columns(*runs[0])
    assert all(columns(*r) == cols for r in runs)  # L is the input's static dim
    x = np.random.default_rng(0).standard_normal((2, ck, cols)).astype(np.float32)
    feeds = [{"x": x, "img": np.array(i, np.int64), "blk": np.array(b, np.int64)} for i, b in runs]
    m = make_model([helper.make_node("Col2Im", ["x", "img", "blk"], ["y"], **attrs)], feeds[0], ["y"], opset=18)
    kiln.compile(m, tmp_path / "m.kiln")
    art = kiln.load(tmp_path / "m.kiln")
    for f in feeds:
        ours, ref = art.run(f)["y"], ort_run(m, f)[0]
        assert ours.shape == ref.shape == (2, ck // int(np.prod(f["blk"])), *f["img"])
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
