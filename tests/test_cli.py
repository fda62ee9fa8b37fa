"""The CLI: exit code 0 on success, 2 with one line on stderr for user errors, traceback only with --debug."""

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import ort_run

from kiln.cli import main


def test_compile_run_inspect(tmp_path, small_onnx_path, small_conv_model, small_input, capsys):
    art = tmp_path / "m.kiln"
    assert main(["compile", str(small_onnx_path), "-o", str(art), "--input-shape", "input:1x3x8x8"]) == 0
    assert "wrote" in capsys.readouterr().out and art.exists()
    np.savez(tmp_path / "in.npz", **small_input)
    assert main(["run", str(art), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as z:
        assert z.files == ["output"]
        np.testing.assert_allclose(z["output"], ort_run(small_conv_model, small_input)[0], rtol=1e-4, atol=1e-4)
    capsys.readouterr()
    assert main(["inspect", str(art), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "artifact" and info["manifest"]["inputs"][0]["name"] == "input"
    assert main(["inspect", str(small_onnx_path)]) == 0
    text = capsys.readouterr().out
    assert "input    input: Nx3x8x8 float32" in text and "Conv 1" in text and "unsupported: none" in text


def _err(capsys):
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_user_errors_exit_2_with_one_line(tmp_path, small_onnx_path, small_artifact, capsys):
    bad = tmp_path / "trunc.onnx"
    bad.write_bytes(small_onnx_path.read_bytes()[:100])
    assert main(["compile", str(bad), "-o", str(tmp_path / "x.kiln")]) == 2
    assert "not a readable ONNX model" in _err(capsys)
    assert main(["compile", str(small_onnx_path), "-o", str(tmp_path / "x.kiln")]) == 2
    assert "--input-shape input:1x3x8x8" in _err(capsys)
    assert main(["compile", str(small_onnx_path), "-o", str(tmp_path / "x.kiln"), "--target", "tpu"]) == 2
    assert "use one of" in _err(capsys)
    np.savez(tmp_path / "in.npz", input=np.zeros((1, 3, 8, 8), np.float64))
    assert main(["run", str(small_artifact), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]) == 2
    assert "dtype float64" in _err(capsys)
    assert (
        main(["run", str(small_artifact), "--inputs", str(tmp_path / "missing.npz"), "-o", str(tmp_path / "o.npz")])
        == 2
    )
    assert "cannot read inputs file" in _err(capsys)
    assert main(["inspect", str(bad)]) == 2
    _err(capsys)
    assert not (tmp_path / "o.npz").exists() and not (tmp_path / "x.kiln").exists()


def test_debug_shows_traceback(tmp_path, capsys):
    bad = tmp_path / "e.onnx"
    bad.write_bytes(b"junk")
    assert main(["--debug", "inspect", str(bad)]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_python_dash_m_kiln(small_artifact):
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "inspect", str(small_artifact), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["manifest"]["outputs"][0]["shape"] == [1, 4, 8, 8]
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "run", str(small_artifact) + ".nope", "--inputs", "x.npz", "-o", "y.npz"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.startswith("kiln run: error:") and "no such artifact" in r.stderr


def _flip_weights_byte(src, dst):
    import zipfile

    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as z:
        info = z.getinfo("weights.bin")
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size // 2] ^= 0xFF
    dst.write_bytes(bytes(data))


def _two_unsupported(path):
    import onnx
    from onnx import helper

    g = helper.make_graph(
        [
            helper.make_node("RegexFullMatch", ["x"], ["a"], pattern="a+", name="d0"),
            helper.make_node("Relu", ["a"], ["y"], name="r0"),
            helper.make_node("Einsum", ["x"], ["z"], equation="ii->i", name="e0"),
            helper.make_node("StringNormalizer", ["x"], ["s"], name="s0"),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in "yzs"],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize(
    "case", ["truncated", "unsupported", "unpinned", "name", "shape", "dtype", "flipped", "feature", "notzip"]
)
def test_every_bad_input_exits_2(tmp_path, small_onnx_path, small_artifact, capsys, case):
    out = str(tmp_path / "o")
    if case in ("truncated", "unsupported", "unpinned"):
        model = tmp_path / "m.onnx"
        if case == "truncated":
            model.write_bytes(small_onnx_path.read_bytes()[:-40])
        elif case == "unsupported":
            _two_unsupported(model)
        else:
            model = small_onnx_path
        argv, expect = (
            ["compile", str(model), "-o", out + ".kiln"],
            {
                "truncated": "not a readable ONNX model",
                "unsupported": "RegexFullMatch",
                "unpinned": "dynamic input dimensions must be pinned",
            }[case],
        )
    elif case in ("name", "shape", "dtype"):
        feed = {
            "name": {"x": np.zeros((1, 3, 8, 8), np.float32)},
            "shape": {"input": np.zeros((2, 3, 8, 8), np.float32)},
            "dtype": {"input": np.zeros((1, 3, 8, 8), np.int32)},
        }[case]
        np.savez(tmp_path / "in.npz", **feed)
        argv, expect = (
            ["run", str(small_artifact), "--inputs", str(tmp_path / "in.npz"), "-o", out + ".npz"],
            {"name": "wrong input names", "shape": "has shape 2x3x8x8", "dtype": "has dtype int32"}[case],
        )
    else:
        art = tmp_path / "a.kiln"
        if case == "flipped":
            _flip_weights_byte(small_artifact, art)
            expect = "corrupt"
        elif case == "feature":
            from tests_runtime_helpers import rewrite_manifest_features

            rewrite_manifest_features(small_artifact, art)
            expect = "CPU features this host lacks"
        else:
            art.write_bytes(b"\x7fELF" + bytes(200))
            expect = "not a valid .kiln file"
        argv = ["run", str(art), "--inputs", str(tmp_path / "in.npz"), "-o", out + ".npz"]
    assert main(argv) == 2
    err = _err(capsys)
    assert expect in err
    if case == "unsupported":
        assert "2 unsupported op type(s)" in err and "StringNormalizer" in err and "first node 'd0'" in err
    assert not any(p.name.startswith("o") for p in tmp_path.iterdir())  # nothing half-written


def test_artifact_commands_do_not_import_torch(tmp_path, small_artifact, small_input):
    """`kiln run` (an artifact-only command, cli.ARTIFACT_ONLY) runs without PyTorch, which importing
    TVM would otherwise load (1.4 s of a 3.6 s `kiln run`); -X importtime lists every module imported."""
    np.savez(tmp_path / "in.npz", **small_input)
    cmd = [
        "-m",
        "kiln",
        "run",
        str(small_artifact),
        "--inputs",
        str(tmp_path / "in.npz"),
        "-o",
        str(tmp_path / "o.npz"),
    ]
    r = subprocess.run([sys.executable, "-X", "importtime", *cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "tvm" in imported and not {"torch._C", "torch.nn"} & imported  # ("torch" itself: the refused tries)
    assert np.load(tmp_path / "o.npz")["output"].shape == (1, 4, 8, 8)
