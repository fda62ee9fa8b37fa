"""SpaceToDepthStem: a stride-2 conv on RGB as a stride-1 conv on 2x2 blocks of 16 channels. Exact in float32 (the
module before and after the pass, run by TVM's VM), the weight mapping against its definition, and the builds that
take it: bf16 (the stem on the bf16 conv kernel, against onnxruntime here) and int8 (the stem quantized)."""

import numpy as np
import pytest
import tvm
from helpers import make_model, ort_run, rand
from onnx import helper
from tvm import relax

import kiln
from kiln.compiler.passes import SpaceToDepthStem
from kiln.compiler.passes.space_to_depth_stem import blocked_weights
from kiln.frontends.importer import import_onnx

ZNVER4 = "llvm -mcpu=znver4"


def _stem(c=3, k=7, pads=(3, 3, 3, 3), hw=(32, 32), out=32):
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], pads=list(pads), strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    inits = {"w": rand(out, c, k, k, seed=1) * 0.3, "b": rand(out, seed=2)}
    return make_model(nodes, {"x": rand(1, c, *hw)}, ["y"], inits)


def _run(mod, x):
    target = tvm.target.Target({"kind": "llvm"})
    with target:
        ex = tvm.compile(relax.get_pipeline("zero")(mod), target=target)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize(
    "c, k, pads, hw",
    [
        (3, 7, (3, 3, 3, 3), (32, 32)),  # ResNet's stem
        (3, 3, (1, 1, 1, 1), (17, 15)),  # MobileNet's, odd sizes
        (1, 5, (2, 1, 2, 1), (20, 13)),  # one channel, asymmetric padding
        (4, 4, (1, 1, 2, 2), (16, 16)),  # 16 blocked channels: no channel padding
    ],
)
def test_exact_in_float32(c, k, pads, hw):
    mod = import_onnx(_stem(c, k, pads, hw)).mod
    p = SpaceToDepthStem()
    blocked = p(mod)
    assert p.stats["space_to_depth_stems"] == 1
    assert "strides=[1, 1]" in blocked["main"].script() and "strides=[2, 2]" not in blocked["main"].script()
    x = rand(1, c, *hw, seed=5)
    np.testing.assert_allclose(_run(blocked, x), _run(mod, x), rtol=1e-5, atol=1e-5)


def test_weights_on_blocks():
    w = rand(8, 3, 7, 7, seed=4)
    b = blocked_weights(w)
    assert b.shape == (8, 16, 4, 4) and not b[:, 12:].any()
    for o, c, ky, kx, dy, dx in [(0, 0, 0, 0, 0, 0), (3, 2, 3, 1, 0, 1), (7, 1, 2, 3, 1, 0)]:
        assert b[o, c * 4 + dy * 2 + dx, ky, kx] == w[o, c, 2 * ky + dy, 2 * kx + dx]
    assert not b[:, :, 3, :][:, [c * 4 + 2 + dx for c in range(3) for dx in (0, 1)]].any()  # tap 7 (2*3+1): none


def test_not_taken():
    """Stride 1, 16 input channels and a 1x1 kernel keep their convs."""
    stride1 = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        {"x": rand(1, 3, 16, 16)},
        ["y"],
        {"w": rand(8, 3, 3, 3)},
    )
    for m in (stride1, _stem(c=16), _stem(k=1, pads=(0, 0, 0, 0))):
        p = SpaceToDepthStem()
        p(import_onnx(m).mod)
        assert p.stats["space_to_depth_stems"] == 0


def test_bf16_and_int8_builds_take_it(tmp_path):
    """bf16 for an AVX512-BF16 target: the stem is one more conv on the bf16 kernel (it stayed float32 before);
    int8: the stem is an int8 layer; fp32: untouched; the host's bf16 build against onnxruntime where it has
    AVX512-BF16."""
    m = _stem()
    fp32 = kiln.compile(m, tmp_path / "f.kiln", target=ZNVER4)
    assert fp32.report.get("space_to_depth_stems", 0) == 0
    bf16 = kiln.compile(m, tmp_path / "b.kiln", target=ZNVER4, precision="bf16")
    assert bf16.report["space_to_depth_stems"] == 1 and bf16.report["bf16_kernel_convs"] == 1
    np.savez(tmp_path / "calib.npz", x=rand(8, 3, 32, 32, seed=7))
    int8 = kiln.compile(
        m, tmp_path / "q.kiln", target=ZNVER4, quantize="int8", calibration=tmp_path / "calib.npz", calib_samples=8
    )
    assert int8.report["space_to_depth_stems"] == 1 and len(int8.report["quantization"]["int8_layers"]) == 1
    host = kiln.compile(m, tmp_path / "h.kiln", precision="bf16")
    if "avx512bf16" not in host.manifest["cpu_features"]:
        pytest.skip("no AVX512-BF16 here: the bf16 build runs only where it has it")
    x = rand(1, 3, 32, 32, seed=6)
    ref = ort_run(m, {"x": x})[0]
    got = kiln.load(tmp_path / "h.kiln").run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=3e-2, atol=2e-2 * np.abs(ref).max())
