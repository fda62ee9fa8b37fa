"""A softmax whose fused epilogue has several blocks (BERT's attention probabilities after
where(isnan(p), 0, p), as the transformers exporter writes them) gets the softmax rule. Its rule used
to assume one consumer and raised, which took the default schedules off the whole model: the corpus
BERTs ran 30x slower than onnxruntime on unscheduled kernels."""

from __future__ import annotations

import numpy as np
from helpers import check_against_ort, make_model, rand
from onnx import helper

import kiln


def test_softmax_with_isnan_where_epilogue_is_scheduled(tmp_path):
    x = rand(2, 4, 32, 32)
    m = make_model(
        [
            helper.make_node("Softmax", ["x"], ["p"], axis=-1),
            helper.make_node("IsNaN", ["p"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "p"], ["y"]),
        ],
        {"x": x},
        ["y"],
        inits={"zero": np.array(0.0, np.float32)},
    )
    res = kiln.compile(m, tmp_path / "s.kiln")
    assert not res.report.get("passes_skipped"), res.report["passes_skipped"]
    assert res.report.get("kernels_unscheduled", 0) == 0, res.report
    check_against_ort(m, {"x": x}, tmp_path, rtol=1e-5, atol=1e-6)
