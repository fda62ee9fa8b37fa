"""The CLI: exit code 0 on success, 2 with one line on stderr for user errors, traceback only with --debug."""
import json
import subprocess
import sys

import numpy as np
import pytest

from kiln.cli import main
from helpers import ort_run


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
    assert main(["run", str(small_artifact), "--inputs", str(tmp_path / "missing.npz"), "-o", str(tmp_path / "o.npz")]) == 2
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
    r = subprocess.run([sys.executable, "-m", "kiln", "inspect", str(small_artifact), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["manifest"]["outputs"][0]["shape"] == [1, 4, 8, 8]
    r = subprocess.run([sys.executable, "-m", "kiln", "run", str(small_artifact) + ".nope", "--inputs", "x.npz", "-o", "y.npz"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("kiln run: error:") and "no such artifact" in r.stderr
