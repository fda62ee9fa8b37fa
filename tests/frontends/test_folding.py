"""ONNX-level folding never stops a compile: a constant subgraph ONNX's reference evaluator cannot
run stays in the graph (one warning per op type), and old opsets fold with their own op versions."""

import warnings

import numpy as np
from helpers import check_against_ort, make_model, rand
from onnx import helper

import kiln


def _unsqueeze_model(opset):
    nodes = [
        helper.make_node("Unsqueeze", ["c"], ["cu"], axes=[0])
        if opset < 13
        else helper.make_node("Unsqueeze", ["c", "ax"], ["cu"]),
        helper.make_node("Add", ["x", "cu"], ["y"]),
    ]
    inits = {"c": rand(3, seed=3)} if opset < 13 else {"c": rand(3, seed=3), "ax": np.array([0], np.int64)}
    return make_model(nodes, {"x": rand(2, 3)}, ["y"], inits, opset=opset)


def test_opset11_unsqueeze_with_axes_attribute_folds(tmp_path):
    # the evaluator given a bare node took Unsqueeze-13 (axes as an input) and raised; Kiln stopped
    with warnings.catch_warnings():
        warnings.simplefilter("error", kiln.errors.KilnWarning)
        r = kiln.compile(_unsqueeze_model(11), tmp_path / "m.kiln")
    assert r.manifest["import_stats"]["folded"] == 1 and "fold_failed" not in r.manifest["import_stats"]
    check_against_ort(_unsqueeze_model(11), {"x": rand(2, 3)}, tmp_path)


def test_a_node_the_evaluator_cannot_run_stays_in_the_graph(tmp_path, monkeypatch):
    from onnx.reference import ReferenceEvaluator

    real = ReferenceEvaluator.run

    def refuse_unsqueeze(self, *a, **kw):
        if any(n.op_type == "Unsqueeze" for n in self.proto_.graph.node):
            raise ValueError("cannot reshape array of size 1 into shape (1,32)")  # as its GatherElements did
        return real(self, *a, **kw)

    monkeypatch.setattr(ReferenceEvaluator, "run", refuse_unsqueeze)
    x = rand(2, 3)
    m = make_model(
        [
            helper.make_node("Unsqueeze", ["c", "ax"], ["cu"]),
            helper.make_node("Unsqueeze", ["c", "ax"], ["cv"]),
            helper.make_node("Add", ["cu", "cv"], ["s"]),
            helper.make_node("Add", ["x", "s"], ["y"]),
        ],
        {"x": x},
        ["y"],
        {"c": rand(3, seed=3), "ax": np.array([0], np.int64)},
        opset=17,
    )
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = kiln.compile(m, tmp_path / "m.kiln")
    ours = [str(i.message) for i in w if issubclass(i.category, kiln.errors.KilnWarning)]
    assert len(ours) == 1 and "cannot fold Unsqueeze" in ours[0] and "stays in the graph" in ours[0]
    assert len(r.manifest["import_stats"]["fold_failed"]["Unsqueeze"]) == 2
    monkeypatch.setattr(ReferenceEvaluator, "run", real)
    check_against_ort(m, {"x": x}, tmp_path)
