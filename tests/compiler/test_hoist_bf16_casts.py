"""HoistBF16Casts: a bf16 cast moves above a max pool (and slices): the conv before writes bf16 alone, and the
result is the same (max and rounding commute), checked bit for bit against the build without the pass here."""

import re

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln
from kiln.compiler.optimize import optimize
from kiln.compiler.options import CompileOptions
from kiln.frontends.importer import import_onnx

ZNVER4 = "llvm -mcpu=znver4"


def _conv_pool_conv():
    """A 16 -> 32 conv, ReLU, a 3x3 stride-2 max pool, then a 32 -> 32 conv (which reads the pool in bf16)."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w2", "b2"], ["y"], kernel_shape=[1, 1]),
    ]
    inits = {"w1": rand(32, 16, 3, 3, seed=1) * 0.2, "b1": rand(32, seed=2), "w2": rand(32, 32, 1, 1, seed=3) * 0.2}
    inits["b2"] = rand(32, seed=4)
    return make_model(nodes, {"x": rand(1, 16, 12, 12)}, ["y"], inits)


def _first_kernel_flags(**opts) -> tuple[int, dict]:
    """The epilogue flags of the first conv's bf16 kernel call for Zen 4 (bf16_epilogue.h: the one with the ReLU's
    clamp), and the report."""
    opt = optimize(import_onnx(_conv_pool_conv()).mod, CompileOptions.make(target=ZNVER4, precision="bf16", **opts))
    flags = re.findall(r'call_extern\("int32", "kiln_bf16_conv2d_nchw16c", (?:[\w.]+, ){6}(\d+),', opt.mod.script())
    return next(int(f) for f in flags if int(f) & 4), opt.report


def test_the_conv_before_the_pool_writes_bf16_alone():
    EP_BIAS, EP_CLAMP, EP_F32, EP_BF16 = 1, 4, 8, 16
    on, report = _first_kernel_flags()
    off, report_off = _first_kernel_flags(disabled_passes=("HoistBF16Casts",))
    assert report["bf16_casts_hoisted"] == 1 and "bf16_casts_hoisted" not in report_off
    assert on == EP_BIAS | EP_CLAMP | EP_BF16 and off == EP_BIAS | EP_CLAMP | EP_F32


def test_same_result_as_without_it(tmp_path):
    m = _conv_pool_conv()
    r = kiln.compile(m, tmp_path / "on.kiln", precision="bf16")
    if "avx512bf16" not in r.manifest["cpu_features"]:
        pytest.skip("no AVX512-BF16 here: the bf16 build runs only where it has it")
    kiln.compile(m, tmp_path / "off.kiln", precision="bf16", disabled_passes=("HoistBF16Casts",))
    x = rand(1, 16, 12, 12, seed=5)
    on, off = (kiln.load(tmp_path / f"{n}.kiln").run({"x": x})["y"] for n in ("on", "off"))
    np.testing.assert_array_equal(on, off)
    ref = ort_run(m, {"x": x})[0]
    np.testing.assert_allclose(on, ref, rtol=3e-2, atol=2e-2 * np.abs(ref).max())
