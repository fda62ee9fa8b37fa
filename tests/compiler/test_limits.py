"""Memory limits: --max-memory refuses a model before building; absurd shapes are a clear error."""

import pytest
from helpers import rand

import kiln
from kiln.cli import main
from kiln.compiler.options import parse_size


def test_max_memory_refuses_before_building(tmp_path, monkeypatch):
    from helpers import make_model
    from onnx import helper

    from kiln.compiler import executable

    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": rand(1, 256)}, ["y"], {"w": rand(256, 256)}
    )
    built = []
    monkeypatch.setattr(executable, "build_executable", lambda *a, **k: built.append(1))
    # every tensor fits 10 KiB, but the 256 KiB of weights do not
    with pytest.raises(
        kiln.ResourceError,
        match=r"planned memory 25\d\.\d KiB \(activations .*, weights 256.0 KiB, inputs and outputs 2.0 KiB\) "
        r"exceeds --max-memory 10.0 KiB",
    ):
        kiln.compile(model, tmp_path / "m.kiln", max_memory="10K")
    assert built == [] and not (tmp_path / "m.kiln").exists()
    with pytest.raises(kiln.ResourceError, match=r"tensor .* would take .* more than --max-memory"):
        kiln.compile(model, tmp_path / "m.kiln", max_memory=512)


def test_max_memory_that_fits_compiles_and_is_in_the_manifest(small_conv_model, tmp_path):
    r = kiln.compile(small_conv_model, tmp_path / "m.kiln", input_shapes=["input:1x3x8x8"], max_memory="1G")
    assert r.manifest["compile_options"]["max_memory"] == 2**30


def test_absurd_input_shape_is_refused_not_an_oom(small_conv_model, tmp_path):
    with pytest.raises(kiln.ResourceError, match=r"tensor .* would take .* more than this host's RAM"):
        kiln.compile(small_conv_model, tmp_path / "m.kiln", input_shapes=["input:100000000x3x8x8"])  # 76 GB input
    assert not (tmp_path / "m.kiln").exists()


def test_cli_max_memory(small_onnx_path, tmp_path, capsys):
    assert (
        main(
            [
                "compile",
                str(small_onnx_path),
                "-o",
                str(tmp_path / "m.kiln"),
                "--input-shape",
                "input:1x3x8x8",
                "--max-memory",
                "1K",
            ]
        )
        == 2
    )
    assert "exceeds --max-memory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, value", [("512M", 512 * 2**20), ("2G", 2 * 2**30), ("1.5gb", int(1.5 * 2**30)), ("100", 100), (4096, 4096)]
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["lots", "-1G", "0", "1Q"])
def test_parse_size_errors(text):
    with pytest.raises(kiln.OptionsError, match="memory size|bad memory size"):
        parse_size(text)


def test_inconsistent_artifact_is_an_artifact_error_at_run(tmp_path, small_artifact):
    from tests_runtime_helpers import rewrite_manifest

    from kiln.runtime import artifact as art

    man = art.read_manifest(small_artifact)
    spec = dict(man["buckets"][0]["inputs"][0], shape=[1, 3, 9, 9])  # the library still expects 8x8
    bucket = dict(man["buckets"][0], inputs=[spec])
    rewrite_manifest(small_artifact, tmp_path / "bad.kiln", buckets=[bucket], inputs=[spec])
    with pytest.raises(kiln.ArtifactError, match="inconsistent"):
        kiln.load(tmp_path / "bad.kiln").run({"input": rand(1, 3, 9, 9)})
