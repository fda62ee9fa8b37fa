"""ConvTransposeAsConv: a ConvTranspose runs as one conv2d and a depth-to-space, and gives onnxruntime's
numbers for the kernels/strides/pads real models use (DBNet's k=2 s=2 upsampling, the k=4 s=2 p=1
deconvolution of CenterNet/GAN decoders, output padding, non-square kernels, a stride of 1)."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import helper

from kiln.compiler.ir import calls
from kiln.compiler.passes import ConvTransposeAsConv
from kiln.compiler.passes.conv_transpose_as_conv import phase_weights
from kiln.frontends.importer import import_onnx

pytestmark = pytest.mark.filterwarnings("error::kiln.errors.KilnWarning")  # a failed optional pass is skipped


def _model(c_in, c_out, size, kernel, group=1, **attrs):
    x = rand(1, c_in, *size)
    nodes = [
        helper.make_node("ConvTranspose", ["input", "w", "b"], ["t"], kernel_shape=kernel, group=group, **attrs),
        helper.make_node("Relu", ["t"], ["output"]),
    ]
    inits = {"w": rand(c_in, c_out // group, *kernel, seed=1) * 0.3, "b": rand(c_out, seed=2)}
    return make_model(nodes, {"input": x}, ["output"], inits), x


CASES = [
    (24, 24, (20, 20), [2, 2], {"strides": [2, 2]}),  # DBNet / PP-OCR det head, U-Net upsampling
    (24, 1, (20, 20), [2, 2], {"strides": [2, 2]}),  # the last one: one output channel
    (16, 32, (9, 9), [4, 4], {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # k=4 s=2 p=1
    (16, 16, (7, 8), [3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    (8, 16, (6, 10), [3, 2], {"strides": [3, 2], "pads": [0, 1, 2, 0]}),  # non-square, asymmetric pads
    (16, 16, (10, 10), [3, 3], {"pads": [1, 1, 1, 1]}),  # stride 1: a conv with the flipped kernel
]


@pytest.mark.parametrize("c_in,c_out,size,kernel,attrs", CASES)
def test_conv_transpose_matches_onnxruntime(tmp_path, c_in, c_out, size, kernel, attrs):
    model, x = _model(c_in, c_out, size, kernel, **attrs)
    p = ConvTransposeAsConv()
    mod = p(import_onnx(model).mod)
    assert p.stats["conv_transpose_as_conv"] == 1
    assert not [c for c in calls(mod["main"]) if getattr(c.op, "name", "") == "relax.nn.conv2d_transpose"]
    check_against_ort(model, {"input": x}, tmp_path, rtol=1e-4, atol=1e-4)


def test_grouped_and_dilated_stay_transposed(tmp_path):
    model, x = _model(16, 16, (8, 8), [2, 2], group=4, strides=[2, 2])
    p = ConvTransposeAsConv()
    p(import_onnx(model).mod)
    assert p.stats["conv_transpose_as_conv"] == 0
    check_against_ort(model, {"input": x}, tmp_path, rtol=1e-4, atol=1e-4)  # TVM's conv2d_transpose still runs


def test_phase_weights_of_a_2x2_stride_2_kernel_are_a_1x1_conv():
    w = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)  # [Ci, Co, KH, KW]
    v = phase_weights(w, (2, 2))
    assert v.shape == (12, 2, 1, 1)
    for co in range(3):
        for r in range(2):
            for c in range(2):
                np.testing.assert_array_equal(v[co * 4 + r * 2 + c, :, 0, 0], w[:, co, r, c])


def test_report_and_blocked_conv():
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions

    model, _ = _model(32, 32, (20, 20), [2, 2], strides=[2, 2])
    opt = optimize(import_onnx(model).mod, CompileOptions.make(target="llvm -mcpu=znver4"))
    assert opt.report["conv_transpose_as_conv"] == 1
    assert opt.report["conv_layouts"] == {"NCHW16c": 1}, opt.report["conv_layouts"]  # 32 -> 128 channels
