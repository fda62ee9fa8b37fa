"""PatchConvAsMatmul: a patch-embedding conv (kernel = stride, no padding), or a wide 1x1 head no block divides, as
one matmul. Numerics of the rewritten module (TVM's VM, any host) against onnxruntime for ViT's (bias, flatten and
transpose after), CLIP's (no bias), a map that is not a multiple of the patch, batch 2, a non-square patch and a
1x1 head; which convs it leaves alone; the builds that take it (pinned targets: the fp32 and bf16 matmul kernels)
and the whole compile against onnxruntime."""

import numpy as np
import pytest
import tvm
from helpers import check_against_ort, make_model, ort_run, rand
from onnx import helper
from tvm import relax

from kiln.compiler.ir import calls
from kiln.compiler.optimize import optimize
from kiln.compiler.options import CompileOptions
from kiln.compiler.passes import PatchConvAsMatmul
from kiln.frontends.importer import import_onnx


def _patch_embed(hw=(64, 64), c=3, out=96, k=(16, 16), stride=None, pads=(0, 0, 0, 0), bias=True, batch=1):
    """Conv -> Flatten(2) -> Transpose, as ViT's and CLIP's exports write it."""
    ins = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [
        helper.make_node("Conv", ins, ["c"], kernel_shape=list(k), strides=list(stride or k), pads=list(pads)),
        helper.make_node("Reshape", ["c", "shape"], ["f"]),
        helper.make_node("Transpose", ["f"], ["y"], perm=[0, 2, 1]),
    ]
    inits = {"w": rand(out, c, *k, seed=1) * 0.05, "shape": np.array([batch, out, -1], np.int64)}
    if bias:
        inits["b"] = rand(out, seed=2)
    return make_model(nodes, {"x": rand(batch, c, *hw)}, ["y"], inits)


def _run(mod, x):
    target = tvm.target.Target({"kind": "llvm"})
    with target:
        ex = tvm.compile(relax.get_pipeline("zero")(mod), target=target)
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _ops(mod) -> list[str]:
    return [getattr(c.op, "name", "") for c in calls(mod["main"])]


@pytest.mark.parametrize(
    "kw",
    [
        {},  # ViT-B/16's shape, smaller: 16x16 patches, bias
        {"k": (32, 32), "bias": False},  # CLIP ViT-B/32's: no bias
        {"hw": (70, 50)},  # not a multiple of the patch: the conv drops the last rows and columns
        {"batch": 2, "hw": (28, 42), "k": (14, 14)},  # CLIP ViT-L/14's patch, two images
        {"k": (8, 16), "c": 4, "out": 40},  # a non-square patch, 40 channels
        {"k": (1, 1), "hw": (13, 13), "c": 32, "out": 260},  # a 1x1 head no block divides (SqueezeNet's 1000)
    ],
)
def test_matches_onnxruntime(kw):
    model = _patch_embed(**kw)
    x = rand(kw.get("batch", 1), kw.get("c", 3), *kw.get("hw", (64, 64)))
    p = PatchConvAsMatmul()
    mod = p(import_onnx(model).mod)
    assert p.stats["patch_conv_as_matmul"] == 1
    ops = _ops(mod)
    assert "relax.nn.conv2d" not in ops and ops.count("relax.matmul") == 1
    np.testing.assert_allclose(_run(mod, x), ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "kw, why",
    [
        ({"k": (4, 4)}, "a 4x4 stem (ConvNeXt, Swin): stays a conv"),
        ({"k": (16, 16), "stride": (8, 8)}, "overlapping patches"),
        ({"pads": (1, 1, 1, 1)}, "padding"),
        ({"hw": (12, 12)}, "a map smaller than the patch"),
        ({"k": (1, 1), "c": 32, "out": 96}, "a 1x1 conv the blocked layout takes (96 = 6 x 16)"),
        ({"k": (1, 1), "c": 32, "out": 21}, "a few-class 1x1 head"),
        ({"k": (1, 1), "c": 32, "out": 200}, "MobileNetV3's 200-channel pointwise conv: blocked by 8"),
    ],
)
def test_other_convs_stay_convs(kw, why):
    p = PatchConvAsMatmul()
    mod = p(import_onnx(_patch_embed(**kw)).mod)
    assert p.stats["patch_conv_as_matmul"] == 0, why
    assert "relax.nn.conv2d" in _ops(mod), why


@pytest.mark.parametrize(
    "target, precision, kernel",
    [
        ("llvm -mcpu=sapphirerapids", "fp32", "f32_kernel_matmuls"),
        ("llvm -mcpu=znver4", "bf16", "bf16_kernel_matmuls"),
        ("llvm -mcpu=sapphirerapids", "bf16", "bf16_kernel_matmuls"),
        ("llvm -mcpu=znver3", "fp32", None),  # no matmul kernel on AVX2: the conv stays on TVM's schedule
    ],
)
def test_builds_put_the_patches_on_the_matmul_kernels(target, precision, kernel):
    opts = CompileOptions.make(target=target, precision=precision)
    report = optimize(import_onnx(_patch_embed()).mod, opts).report
    assert report.get("patch_conv_as_matmul", 0) == (1 if kernel else 0)
    if kernel:
        assert report[kernel] == 1


def test_compiled_on_the_host_matches_onnxruntime(tmp_path):
    model = _patch_embed(hw=(48, 80), out=128)
    check_against_ort(model, {"x": rand(1, 3, 48, 80)}, tmp_path, rtol=1e-4, atol=1e-4)
