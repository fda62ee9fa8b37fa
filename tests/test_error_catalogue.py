"""The error catalogue: every KilnError Kiln raises names where (file, node, input or option) and
the fix. Statically: each `raise` of a KilnError class passes where= and fix=. Dynamically: a walk
over one real trigger per error path, each checked for both."""

import ast
import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import make_model, rand
from onnx import helper

import kiln
from kiln import errors

KILN = Path(kiln.__file__).parent
ERROR_CLASSES = {
    name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, errors.KilnError)
}


def _raises():
    for f in sorted(KILN.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call):  # raised or returned: every construction of a Kiln error
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                if name in ERROR_CLASSES:
                    yield f.relative_to(KILN.parent), node.lineno, name, {k.arg: k.value for k in node.keywords}


def test_every_raise_names_where_and_the_fix():
    sites = list(_raises())
    assert len(sites) > 100  # the catalogue is real
    bad = [
        f"{f}:{line} {name} lacks "
        f"{[k for k in ('where', 'fix') if k not in kw or isinstance(kw[k], ast.Constant) and kw[k].value is None]}"
        for f, line, name, kw in sites
        if any(k not in kw or isinstance(kw[k], ast.Constant) and kw[k].value is None for k in ("where", "fix"))
    ]
    assert not bad, "\n".join(bad)


def _model_file(tmp_path, nodes, inputs, outputs, inits=None, name="m.onnx", **kw):
    m = make_model(nodes, inputs, outputs, inits, **kw)
    p = tmp_path / name
    onnx.save(m, p)
    return p


def _triggers(tmp_path, small_artifact):
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    x = {"x": rand(1, 4)}
    dyn = _model_file(tmp_path, relu, x, ["y"], in_shapes={"x": ["N", 4]}, name="dyn.onnx")
    g = helper.make_graph(
        [helper.make_node("Foo", ["x"], ["y"], domain="com.evil")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    custom = tmp_path / "custom.onnx"
    onnx.save(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.evil", 1)]), custom
    )
    (tmp_path / "junk.onnx").write_bytes(b"\x00junk")
    (tmp_path / "junk.kiln").write_bytes(b"junk")
    tampered = tmp_path / "tampered.kiln"
    with zipfile.ZipFile(small_artifact) as z, zipfile.ZipFile(tampered, "w") as out:
        for n in z.namelist():
            data = z.read(n)
            out.writestr(n, json.dumps(dict(json.loads(data), format_version=99)) if n == "manifest.json" else data)
    model = kiln.load(small_artifact)
    return {
        "missing model file": (
            kiln.ModelLoadError,
            lambda: kiln.compile(tmp_path / "nope.onnx", tmp_path / "o.kiln"),
            "nope.onnx",
        ),
        "unreadable model": (
            kiln.ModelLoadError,
            lambda: kiln.compile(tmp_path / "junk.onnx", tmp_path / "o.kiln"),
            "junk.onnx",
        ),
        "unsupported op": (
            kiln.UnsupportedModelError,
            lambda: kiln.compile(custom, tmp_path / "o.kiln"),
            "custom.onnx",
        ),
        "unpinned dim": (kiln.ShapeError, lambda: kiln.compile(dyn, tmp_path / "o.kiln"), "dyn.onnx"),
        "wrong rank pinned": (
            kiln.ShapeError,
            lambda: kiln.compile(dyn, tmp_path / "o.kiln", input_shapes=["x:1x2x3"]),
            "dyn.onnx",
        ),
        "bad shape spec": (
            kiln.ShapeError,
            lambda: kiln.compile(dyn, tmp_path / "o.kiln", input_shapes=["x:1xz"]),
            "--input-shape",
        ),
        "bad target": (
            kiln.TargetError,
            lambda: kiln.compile(dyn, tmp_path / "o.kiln", target="riscv-toaster"),
            "--target",
        ),
        "bad option": (kiln.OptionsError, lambda: kiln.compile(dyn, tmp_path / "o.kiln", opt_level=9), "--opt-level"),
        "absurd shape": (
            kiln.ResourceError,
            lambda: kiln.compile(dyn, tmp_path / "o.kiln", input_shapes=["x:100000000000x4"]),
            "dyn.onnx",
        ),
        "missing artifact": (kiln.ArtifactError, lambda: kiln.load(tmp_path / "none.kiln"), "none.kiln"),
        "not an artifact": (kiln.ArtifactError, lambda: kiln.load(tmp_path / "junk.kiln"), "junk.kiln"),
        "format version": (kiln.IncompatibleArtifactError, lambda: kiln.load(tampered), "tampered.kiln"),
        "wrong input name": (kiln.InputError, lambda: model.run({"nope": rand(1, 3, 8, 8)}), "small.kiln"),
        "wrong input dtype": (
            kiln.InputError,
            lambda: model.run({"input": np.zeros((1, 3, 8, 8), np.float64)}),
            "small.kiln",
        ),
        "wrong input shape": (kiln.InputError, lambda: model.run({"input": rand(1, 3, 9, 9)}), "small.kiln"),
        "unknown zoo model": (kiln.OptionsError, lambda: __import__("kiln.zoo").zoo.build("alexnet"), "zoo"),
    }


def test_walk_the_error_catalogue(tmp_path, small_artifact):
    for name, (cls, trigger, where) in _triggers(tmp_path, small_artifact).items():
        with pytest.raises(cls) as e:
            trigger()
        err = e.value
        assert err.where and err.fix, f"{name}: where={err.where!r} fix={err.fix!r}"
        assert where in err.where, f"{name}: where={err.where!r}, expected {where!r}"
        assert str(err).startswith(f"{err.where}: ") and f" -> {err.fix}" in str(err), name
