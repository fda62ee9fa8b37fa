"""The artifacts the serving tests serve, compiled once per session."""

import pytest
from helpers import make_model, rand
from onnx import helper

import kiln


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """A conv model with batch buckets 1, 2, 4, 8, and a second version with other weights."""
    d = tmp_path_factory.mktemp("serve")
    paths = []
    for seed in (1, 7):
        nodes = [
            helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["output"]),
        ]
        m = make_model(
            nodes,
            {"input": rand(1, 3, 16, 16)},
            ["output"],
            {"w": rand(8, 3, 3, 3, seed=seed), "b": rand(8, seed=2)},
            in_shapes={"input": ["N", 3, 16, 16]},
        )
        p = d / f"net{seed}.kiln"
        kiln.compile(m, p, shape_buckets="input:1x3x16x16,2x3x16x16,4x3x16x16,8x3x16x16")
        paths.append(p)
    return paths
