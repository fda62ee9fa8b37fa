"""A softmax whose fused epilogue has several blocks (BERT's attention probabilities after
where(isnan(p), 0, p), as the transformers exporter writes them) gets the softmax rule. Its rule used
to assume one consumer and raised, which took the default schedules off the whole model: the corpus
BERTs ran 30x slower than onnxruntime on unscheduled kernels."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import helper

import kiln
from kiln.errors import KilnWarning


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


def test_a_rule_bug_leaves_one_kernel_unscheduled_and_names_it(tmp_path, monkeypatch):
    """Outside strict mode (users), a rule that raises something other than ScheduleError costs its kernel
    its schedule, with a warning and report['rule_errors'] naming it; the other kernels keep theirs."""
    from kiln.schedules.rules import registry

    def buggy(sch, anchor, lanes):
        raise IndexError("an injected rule bug")

    monkeypatch.delenv("KILN_STRICT_RULES", raising=False)
    monkeypatch.setitem(registry.RULES, ("cpu", "softmax"), buggy)
    x = rand(2, 4, 32, 32)
    m = make_model(
        [helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("Relu", ["x"], ["r"])],
        {"x": x},
        ["p", "r"],
    )
    with pytest.warns(KilnWarning, match="injected rule bug"):
        res = kiln.compile(m, tmp_path / "s.kiln")
    assert not res.report.get("passes_skipped")
    errs = res.report["rule_errors"]
    assert len(errs) == 1 and "softmax" in errs[0]["kernel"] and "IndexError" in errs[0]["error"]
    assert res.report["kernels_scheduled"] >= 1 and res.report["kernels_unscheduled"] >= 1
    check_against_ort(m, {"x": x}, tmp_path, rtol=1e-5, atol=1e-6)
