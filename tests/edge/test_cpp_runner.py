"""The Python-free runner: built for x86-64 it gives the same outputs as `kiln run`; cross-built
for aarch64 against the aarch64 apache-tvm wheel's runtime and run under qemu-aarch64 on aarch64
artifacts of zoo ResNet-18 and MobileNetV2, it matches onnxruntime (rtol/atol 1e-4). The aarch64
tests need the cross toolchain, qemu-user and the aarch64 runtime (`make edge-test` installs
them) and say so when they skip."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import ort_run

import kiln
from kiln import zoo
from kiln.cli import main

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "kiln" / "runtime" / "cpp" / "build.sh"
AARCH64_RUNTIME = REPO / "build" / "edge" / "aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")


def _build(out: Path, *args) -> Path:
    import sys

    r = subprocess.run(
        ["bash", str(BUILD), str(out), *args],
        capture_output=True,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin:/usr/local/bin"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def x86_runner(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: the C++ runner cannot be built")
    return _build(tmp_path_factory.mktemp("cpp") / "kiln_run")


@pytest.fixture(scope="module")
def aarch64_runner(tmp_path_factory):
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64") if shutil.which(t) is None]
    if missing or not (AARCH64_RUNTIME / ".ready").exists() or not SYSROOT.exists():
        pytest.skip(
            f"aarch64 checks need {', '.join(missing) or 'nothing more'}"
            f"{'' if (AARCH64_RUNTIME / '.ready').exists() else ' and the aarch64 TVM runtime in build/edge'}"
            ": run `make edge-test`"
        )
    return _build(
        tmp_path_factory.mktemp("cpp-arm") / "kiln_run",
        "aarch64-linux-gnu-g++",
        str(AARCH64_RUNTIME / "tvm"),
        str(AARCH64_RUNTIME / "tvm_ffi"),
    )


def _unpack(art: Path, dest: Path) -> Path:
    assert main(["unpack", str(art), str(dest)]) == 0
    return dest


def _run(cmd, model_dir: Path, out: Path, *inputs: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*cmd, str(model_dir), "-o", str(out), *map(str, inputs)], capture_output=True, text=True, timeout=600
    )


def test_x86_runner_matches_kiln_run(tmp_path, x86_runner):
    model = zoo.resnet18(size=64, classes=10)
    kiln.compile(model, tmp_path / "m.kiln", input_shapes=["input:1x3x64x64"])
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = _run([str(x86_runner)], _unpack(tmp_path / "m.kiln", tmp_path / "m"), tmp_path / "out", tmp_path / "x.npy")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(
        np.load(tmp_path / "out" / "output.npy"), kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    )


def test_x86_runner_takes_shared_weights_on_either_thread_pool(tmp_path, x86_runner):
    """Identical weights are stored once and the bucket lists indices into them: kiln_run passed every
    stored weight in order (43 parameters expected, 28 given, on a real ResNet-18). Its output equals
    kiln.load's on Kiln's thread pool and with KILN_THREAD_POOL=tvm."""
    import os

    from helpers import make_model, rand
    from onnx import helper

    w = rand(8, 8, 3, 3, seed=1)
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["output"], pads=[1, 1, 1, 1]),
    ]
    model = make_model(nodes, {"input": rand(1, 8, 16, 16)}, ["output"], {"w1": w, "w2": w.copy()})
    r = kiln.compile(model, tmp_path / "m.kiln")
    bucket = r.manifest["buckets"][0]["weights"]
    assert len(set(bucket)) < len(bucket)  # the two convs' weights are one stored array
    x = rand(1, 8, 16, 16, seed=3)
    np.save(tmp_path / "x.npy", x)
    d = _unpack(tmp_path / "m.kiln", tmp_path / "m")
    want = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    for pool in ("kiln", "tvm"):
        env = {**os.environ, "KILN_THREAD_POOL": pool}
        out = tmp_path / f"out-{pool}"
        r = subprocess.run(
            [str(x86_runner), str(d), "-o", str(out), str(tmp_path / "x.npy")],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(out / "output.npy"), want)


def test_x86_runner_refuses_bad_members_and_inputs(tmp_path, x86_runner, small_conv_model):
    kiln.compile(small_conv_model, tmp_path / "m.kiln", input_shapes=["input:1x3x8x8"])
    d = _unpack(tmp_path / "m.kiln", tmp_path / "m")
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 8, 8), np.float64))
    r = _run([str(x86_runner)], d, tmp_path / "o", tmp_path / "bad.npy")
    assert r.returncode == 2 and "needs float32" in r.stderr
    r = _run([str(x86_runner)], d, tmp_path / "o")
    assert r.returncode == 2 and "inputs" in r.stderr
    blob = bytearray((d / "weights.bin").read_bytes())
    blob[0] ^= 1
    (d / "weights.bin").write_bytes(bytes(blob))
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    r = _run([str(x86_runner)], d, tmp_path / "o", tmp_path / "x.npy")
    assert r.returncode == 2 and "checksum mismatch" in r.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_aarch64_zoo_under_qemu_matches_onnxruntime(tmp_path, aarch64_runner, name):
    build, shape = zoo.MODELS[name]
    model = build()
    onnx.save(model, tmp_path / "m.onnx")
    r = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", input_shapes=[shape], target="arm64")
    assert r.manifest["arch"] == "aarch64"
    with pytest.raises(kiln.IncompatibleArtifactError, match="built for aarch64"):
        kiln.load(tmp_path / "m.kiln")  # not on this x86-64 host
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    qemu = [
        "qemu-aarch64",
        "-L",
        str(SYSROOT),
        "-E",
        f"LD_LIBRARY_PATH={AARCH64_RUNTIME / 'tvm' / 'lib'}:{AARCH64_RUNTIME / 'tvm_ffi' / 'lib'}",
        str(aarch64_runner),
    ]
    run = _run(qemu, _unpack(tmp_path / "m.kiln", tmp_path / "m"), tmp_path / "out", tmp_path / "x.npy")
    assert run.returncode == 0, run.stderr[-2000:]
    np.testing.assert_allclose(
        np.load(tmp_path / "out" / "output.npy"), ort_run(model, {"input": x})[0], rtol=1e-4, atol=1e-4
    )
