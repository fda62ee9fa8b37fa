"""The arm64 int8 kernels run: a zoo ResNet-18 (64x64) quantized by `kiln compile --quantize int8
--target rpi5` (sdot kernels, Cortex-A76) runs in the C++ runner under qemu-aarch64 and gives what
the same int8 graph built for this host gives (same integer math: only the float epilogues' rounding
may differ), close to onnxruntime's float32. Needs the edge tools (see test_cpp_runner.py)."""

from __future__ import annotations

import numpy as np
from helpers import default_caps, ort_run
from test_cpp_runner import AARCH64_RUNTIME, SYSROOT, _run, _unpack, aarch64_runner  # noqa: F401 (fixture)

import kiln
from kiln import zoo


def test_rpi5_int8_resnet18_under_qemu(tmp_path, aarch64_runner):  # noqa: F811
    model = zoo.resnet18(size=64, classes=10)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", input=rng.standard_normal((6, 3, 64, 64)).astype(np.float32))
    kw = {"input_shapes": ["input:1x3x64x64"], "quantize": "int8", "calibration": tmp_path / "calib.npz"}
    r = kiln.compile(model, tmp_path / "arm.kiln", target="rpi5", **kw)
    q = r.report["quantization"]
    assert r.manifest["arch"] == "aarch64" and q["speed"]["int8_kernel"] == "dotprod" and len(q["int8_layers"]) >= 16
    # the same int8 graph for the host only where its int8 kernel is a dot product with 8-bit weights, as
    # sdot is: on AVX2 (vpmaddubsw) the quantizer uses 7-bit weights and keeps more layers float (int8 gains
    # 2x there), so there the host build is not compiled (its numerics: tests/compiler/test_quantize.py)
    caps = default_caps()  # the host build's target: KILN_TARGET where set
    same = caps.int8_dot in ("avx512-vnni", "avx-vnni", "amx-int8")
    if same:
        host = kiln.compile(model, tmp_path / "host.kiln", **kw)
        assert host.report["quantization"]["speed"]["int8_kernel"] == caps.int8_path
        assert host.report["quantization"]["int8_layers"] == q["int8_layers"]

    x = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    qemu = [
        "qemu-aarch64",
        "-L",
        str(SYSROOT),
        "-E",
        f"LD_LIBRARY_PATH={AARCH64_RUNTIME / 'tvm' / 'lib'}:{AARCH64_RUNTIME / 'tvm_ffi' / 'lib'}",
        str(aarch64_runner),
    ]
    run = _run(qemu, _unpack(tmp_path / "arm.kiln", tmp_path / "arm"), tmp_path / "out", tmp_path / "x.npy")
    assert run.returncode == 0, run.stderr[-2000:]
    got = np.load(tmp_path / "out" / "output.npy")
    outs = [got]
    if same:
        host_out = kiln.load(tmp_path / "host.kiln").run({"input": x})["output"]
        np.testing.assert_allclose(got, host_out, rtol=1e-3, atol=1e-3 * np.abs(host_out).max())
        outs.append(host_out)
    ref = ort_run(model, {"input": x})[0]
    for out in outs:
        cos = float(np.sum(out * ref) / (np.linalg.norm(out) * np.linalg.norm(ref)))
        assert cos > 0.99
