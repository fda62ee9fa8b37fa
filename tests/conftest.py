import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

sys.path.insert(0, str(Path(__file__).parent))
# the suite compiles with default schedules whatever records ship for this machine (tests that
# need shipped records point this at their own folder); subprocesses inherit it
os.environ["KILN_TUNING_LOGS"] = "none"
# a bug in a default schedule rule fails the test instead of leaving one kernel unscheduled
os.environ["KILN_STRICT_RULES"] = "1"

from helpers import make_model, rand


@pytest.fixture(scope="session")
def small_conv_model() -> onnx.ModelProto:
    """Conv + Relu with a symbolic batch: the smallest model that exercises the whole path."""
    x = rand(1, 3, 8, 8)
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["output"]),
    ]
    return make_model(
        nodes,
        {"input": x},
        ["output"],
        {"w": rand(4, 3, 3, 3, seed=1), "b": rand(4, seed=2)},
        in_shapes={"input": ["N", 3, 8, 8]},
    )


@pytest.fixture(scope="session")
def small_artifact(tmp_path_factory, small_conv_model) -> Path:
    import kiln

    path = tmp_path_factory.mktemp("art") / "small.kiln"
    kiln.compile(small_conv_model, path, input_shapes=["input:1x3x8x8"])
    return path


@pytest.fixture
def small_input() -> dict:
    return {"input": rand(1, 3, 8, 8, seed=5)}


@pytest.fixture
def small_onnx_path(tmp_path, small_conv_model) -> Path:
    p = tmp_path / "small.onnx"
    onnx.save(small_conv_model, p)
    return p


__all__ = ["np"]
