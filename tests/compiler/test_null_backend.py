"""The null backend (tinygrad's NULL device): a compile through it runs every stage but code
generation, so the driver needs nothing of a backend beyond the interface (backends/base.py)."""

import dataclasses
import zipfile

import pytest
from helpers import make_model, rand
from onnx import helper

import kiln
from kiln.compiler import CompileOptions, compile_model
from kiln.compiler.backends import BACKENDS, BY_TARGET_KIND, CPU, NULL, backend_for
from kiln.compiler.pipeline import STAGES
from kiln.errors import ArtifactError, IncompatibleArtifactError
from kiln.target import Kind, Target


def _model():
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["c"], ["y"], name="relu0"),
    ]
    return make_model(nodes, {"x": rand(1, 3, 8, 8)}, ["y"], {"w": rand(8, 3, 3, 3, seed=1), "b": rand(8, seed=2)})


def test_a_model_compiles_with_the_null_backend(tmp_path):
    options = dataclasses.replace(CompileOptions.make(), backend=NULL)
    r = compile_model(_model(), tmp_path / "m.kiln", options)
    m = r.manifest
    assert m["device"] == "null" and m["cpu_features"] == [] and m["accelerator"] is None
    assert r.report["kernels"] >= 1 and r.report["weights_bytes"] > 0  # optimized, weights lifted and stored
    assert [b["library"] for b in m["buckets"]] == ["model.so"]
    with zipfile.ZipFile(r.path) as z:
        assert z.read("model.so") == b""  # no code generated
    with pytest.raises((ArtifactError, IncompatibleArtifactError)):
        kiln.load(r.path)  # a device the runtime does not know


def test_every_backend_supplies_the_interface():
    for name, b in BACKENDS.items():
        assert b.kind == name
        rows = b.all_rows()
        assert rows == [r for s in STAGES for r in b.rows(s)], name  # the stages, in order, are the pipeline
        assert all(r.graph for r in b.rows(STAGES[0])) and not any(r.graph for r in b.rows(STAGES[1])), name
        assert {r.name for r in rows if r.required} <= {r.name for r in b.pipeline(0)}, name
    assert backend_for(Target.parse("llvm -mcpu=znver4")) is CPU
    assert backend_for(Target.parse("cuda -arch=sm_80")).kind == "cuda"
    assert backend_for(Target.parse("vta-sim")).kind == "vta"
    assert set(BY_TARGET_KIND) == set(Kind)  # every target kind has its backend
