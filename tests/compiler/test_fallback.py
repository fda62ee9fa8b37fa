"""No valid model refused by an optional optimization, and honest errors: a pass bug on a valid
model falls back (warning, passes_skipped, correct artifact) or, when nothing builds, is an internal
error (exit 1) naming the pass and node, with a reproducer that fails the same way."""

import warnings

import numpy as np
import onnx
import pytest
from helpers import check_against_ort, make_model, ort_run, rand
from onnx import helper

import kiln
from kiln.cli import main as cli_main
from kiln.compiler import pipeline
from kiln.compiler.backends import cpu
from kiln.errors import InternalError, KilnWarning


def _model():
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["c"], ["r"], name="relu0"),
        helper.make_node("Conv", ["r", "w2"], ["c2"], name="conv1"),
        helper.make_node("Sigmoid", ["c2"], ["s"], name="the_sigmoid"),
        helper.make_node("Add", ["s", "c2"], ["y"], name="add0"),
    ]
    inits = {"w": rand(16, 3, 3, 3, seed=1) * 0.3, "b": rand(16, seed=2), "w2": rand(16, 16, 1, 1, seed=3) * 0.3}
    return make_model(nodes, {"x": rand(1, 3, 8, 8)}, ["y"], inits)


def _bug_on(op_name: str, stage_of=None):
    """A pass that raises when the module (or, with stage_of, a blocked-layout module) holds op_name."""

    def make(o):
        real = stage_of.make(o) if stage_of else None

        def run(mod):
            text = mod.script(show_meta=False)
            if op_name in text and (stage_of is None or "NCHW" in text and "c" in text.split("NCHW", 1)[1][:4]):
                raise RuntimeError(f"injected bug: cannot handle {op_name}")
            return real(mod) if real else mod

        return run

    return make


def _patch_row(monkeypatch, name, make):
    rows = list(cpu.ROWS)
    i = [s.name for s in rows].index(name)
    rows[i] = pipeline.PassSpec(name, make, rows[i].opt_level, rows[i].required, rows[i].graph)
    monkeypatch.setattr(cpu, "ROWS", tuple(rows))


def test_optional_pass_bug_is_skipped_with_a_warning(tmp_path, monkeypatch):
    _patch_row(monkeypatch, "RemoveNoOps", _bug_on("sigmoid"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ours = check_against_ort(_model(), {"x": rand(1, 3, 8, 8, seed=4)}, tmp_path)
    r = kiln.compile(_model(), tmp_path / "again.kiln")
    assert ours and r.report["passes_skipped"][0]["passes"] == ["RemoveNoOps"]
    assert r.manifest["passes_skipped"][0]["failed_in"] == "RemoveNoOps"
    assert any(issubclass(i.category, KilnWarning) and "RemoveNoOps failed" in str(i.message) for i in w)


def test_a_later_failure_falls_back_to_nchw(tmp_path, monkeypatch):
    # LegalizeOps (required) fails only on the blocked layout: the ladder's first rung builds
    legal = next(s for s in cpu.ROWS if s.name == "LegalizeOps")
    _patch_row(monkeypatch, "LegalizeOps", _bug_on("conv2d", stage_of=legal))
    x = rand(1, 3, 8, 8, seed=4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = kiln.compile(_model(), tmp_path / "m.kiln")
    skip = r.report["passes_skipped"]
    assert (
        skip and skip[0]["rung"] == "layout" and skip[0]["failed_in"] == "LegalizeOps" and skip[0]["layout"] == "NCHW"
    )
    assert r.manifest["compile_options"]["layout_chosen"] == "NCHW"
    assert skip[0]["node"] == "conv0"  # the first node whose prefix fails
    assert any("compiled without the blocked layout" in str(i.message) for i in w)
    np.testing.assert_allclose(
        kiln.load(tmp_path / "m.kiln").run({"x": x})["y"], ort_run(_model(), {"x": x})[0], rtol=1e-4, atol=1e-4
    )


def test_a_kiln_bug_is_an_internal_error_with_a_reproducer(tmp_path, monkeypatch, capsys):
    _patch_row(monkeypatch, "LegalizeOps", _legalize_bug())
    src = tmp_path / "valid.onnx"
    onnx.save(_model(), src)
    out = tmp_path / "out" / "m.kiln"
    out.parent.mkdir()
    code = cli_main(["compile", str(src), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "internal error in LegalizeOps at node 'the_sigmoid'" in err and "injected bug" in err
    assert "not in your model" in err and "inconsistent" not in err
    repro = out.with_name("m.repro.onnx")
    assert repro.exists() and str(repro) in err and not out.exists()
    small = onnx.load(repro)
    assert [n.op_type for n in small.graph.node] == ["Sigmoid"]  # the smallest failing subgraph
    with pytest.raises(InternalError) as e:  # and it fails the same way
        kiln.compile(small, tmp_path / "r.kiln")
    assert e.value.stage == "LegalizeOps" and e.value.node == "the_sigmoid"


def _legalize_bug():
    legal = next(s for s in cpu.ROWS if s.name == "LegalizeOps")

    def make(o):
        real = legal.make(o)

        def run(mod):
            if "R.sigmoid" in mod.script(show_meta=False):
                raise RuntimeError("injected bug: cannot legalize sigmoid")
            return real(mod)

        return run

    return make


def test_an_invalid_model_is_blamed_only_when_onnx_rejects_it(tmp_path):
    from kiln.compiler.fallback import blame
    from kiln.errors import ModelLoadError, PassError

    bad = make_model([helper.make_node("Concat", ["x", "z"], ["y"], axis=1)], {"x": rand(1, 4), "z": rand(2, 4)}, ["y"])
    err = PassError("LegalizeOps", RuntimeError("boom"), where="m.onnx")
    assert isinstance(blame(err, bad, "m.onnx", None), ModelLoadError)
    assert isinstance(blame(err, _model(), "m.onnx", None), InternalError)
