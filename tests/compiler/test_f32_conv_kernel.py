"""F32ConvKernel: float32 convs in NCHW16c on Kiln's AVX-512 C kernel (f32_conv.c). Which targets take them
(structural, pinned targets on any host), and the numbers on the host against onnxruntime over the geometries the
kernel branches on: ragged rows (tiles of up to 14 pixels), an odd count of output blocks (a one-block tile),
strides 1 and 2, dilation, padding on either side (the zero-column copy), taps past the bottom row, and the epilogue
it takes (bias, residual, ReLU, ReLU6, GELU in its erf and tanh forms)."""

import numpy as np
import pytest
from helpers import make_model, ort_run, rand, target_cpu_flags
from onnx import helper

import kiln
from kiln.compiler.optimize import optimize
from kiln.compiler.options import CompileOptions
from kiln.frontends.importer import import_onnx

needs_avx512 = pytest.mark.skipif(
    "avx512f" not in target_cpu_flags(), reason="running it needs AVX-512 (avx512f, host and target)"
)


def _block(c: int, o: int, hw: tuple[int, int], k: int, stride: int, pads: list[int], act: str, dilation: int = 1):
    """conv (+ bias) -> + residual (a 1x1 conv of the input, when the shapes allow) -> activation."""
    h, w = hw
    span = dilation * (k - 1) + 1
    oh, ow = (h + pads[0] + pads[2] - span) // stride + 1, (w + pads[1] + pads[3] - span) // stride + 1
    conv = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], pads=pads, strides=[stride] * 2, dilations=[dilation] * 2
    )
    nodes = [conv]
    inits = {"w": rand(o, c, k, k, seed=1) * 0.1, "b": rand(o, seed=2)}
    last = "y"
    if (oh, ow) == (h, w):
        nodes += [
            helper.make_node("Conv", ["x", "wr"], ["r"], kernel_shape=[1, 1]),
            helper.make_node("Add", ["y", "r"], ["s"]),
        ]
        inits["wr"] = rand(o, c, 1, 1, seed=3) * 0.1
        last = "s"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [last], ["out"]))
    elif act == "gelu_erf":  # as TorchScript exports nn.GELU before opset 20
        nodes += [
            helper.make_node("Div", [last, "sqrt2"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            helper.make_node("Mul", [last, "e1"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["out"]),
        ]
        inits.update({k: np.array(v, np.float32) for k, v in (("sqrt2", 2**0.5), ("one", 1.0), ("half", 0.5))})
    elif act == "gelu_tanh":  # GPT-2's: 0.5 y (1 + tanh(sqrt(2 / pi) (y + 0.044715 y^3)))
        nodes += [
            helper.make_node("Pow", [last, "three"], ["p"]),
            helper.make_node("Mul", ["p", "k"], ["pk"]),
            helper.make_node("Add", [last, "pk"], ["i"]),
            helper.make_node("Mul", ["i", "c"], ["ic"]),
            helper.make_node("Tanh", ["ic"], ["t"]),
            helper.make_node("Add", ["t", "one"], ["t1"]),
            helper.make_node("Mul", [last, "t1"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["out"]),
        ]
        consts = (("three", 3.0), ("k", 0.044715), ("c", (2 / np.pi) ** 0.5), ("one", 1.0), ("half", 0.5))
        inits.update({k: np.array(v, np.float32) for k, v in consts})
    else:
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["out"]))
        inits.update({"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)})
    return make_model(nodes, {"x": rand(1, c, h, w)}, ["out"], inits)


GEOMETRIES = {  # (in channels, out channels, map, kernel, stride, ONNX pads [top, left, bottom, right], activation)
    "3x3_ragged_odd_blocks": (32, 48, (13, 13), 3, 1, [1, 1, 1, 1], "relu"),
    "3x3_stride2": (32, 32, (15, 15), 3, 2, [1, 1, 1, 1], "relu6"),
    "wide_rows_three_tiles": (16, 32, (5, 40), 3, 1, [1, 1, 1, 1], "relu"),
    "1x1_residual": (64, 32, (9, 9), 1, 1, [0, 0, 0, 0], "relu"),
    "5x5_asymmetric_pads": (16, 32, (11, 12), 5, 1, [2, 1, 1, 2], "relu6"),
    "right_and_bottom_pads_only": (16, 16, (10, 10), 3, 1, [0, 0, 2, 2], "relu"),  # copied though PL is 0
    "7x7_map_direct": (32, 64, (7, 7), 3, 1, [1, 1, 1, 1], "relu"),
    "gelu_erf": (16, 32, (6, 30), 3, 2, [1, 1, 1, 1], "gelu_erf"),
    "gelu_tanh_residual": (32, 32, (8, 21), 3, 1, [1, 1, 1, 1], "gelu_tanh"),
    "dilated_2": (32, 32, (17, 19), 3, 1, [2, 2, 2, 2], "relu", 2),  # FCN/DeepLab's dilated stages
    "dilated_4_stride2_rows_off_the_map": (16, 32, (9, 11), 3, 2, [4, 4, 4, 4], "relu6", 4),
}


@needs_avx512
@pytest.mark.parametrize("geometry", GEOMETRIES.values(), ids=GEOMETRIES.keys())
def test_matches_onnxruntime(tmp_path, geometry):
    m = _block(*geometry)
    r = kiln.compile(m, tmp_path / "m.kiln", disabled_passes=("Winograd",))
    assert r.report["f32_kernel_convs"] >= 1 and r.report["bf16_epilogues_fused"] >= 1
    model = kiln.load(tmp_path / "m.kiln")
    info = model.manifest["buckets"][0]["kernel_info"]
    kinds = [v["kind"] for v in info.values()]
    assert "f32_conv" in kinds and not any(k.startswith("conv2d") for k in kinds)  # no conv left to TVM's schedule
    if geometry[6].startswith("gelu"):  # the GELU in the kernel's epilogue: kiln_f32_conv[_add]_gelu
        assert any(name.startswith("kiln_f32_conv") and "_gelu" in name for name in info), list(info)
    x = rand(*_shape(m), seed=7)
    got = model.run({"x": x})["out"]
    ref = ort_run(m, {"x": x})[0]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def _shape(m) -> tuple:
    return tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim)


@pytest.mark.parametrize(
    "target, taken",
    [("llvm -mcpu=znver4", True), ("llvm -mcpu=sapphirerapids", True), ("llvm -mcpu=znver3", False)],
)
def test_avx512_targets_take_fp32_convs(target, taken):
    """Structural: the kernel on AVX-512 targets; AVX2 keeps TVM's schedule. The 3x3 conv on a 7x7 map (an F(2x2)
    of 16 tiles) goes to the kernel where it exists, else to Winograd."""
    m = _block(32, 64, (7, 7), 3, 1, [1, 1, 1, 1], "relu")
    report = optimize(import_onnx(m).mod, CompileOptions.make(target=target)).report
    assert (report["f32_kernel_convs"] == 2) is taken  # the 3x3 and the residual's 1x1
    assert report["winograd_convs"] == (0 if taken else 1)
    assert (report["bf16_epilogues_fused"] >= 1) is taken


def test_winograd_keeps_larger_maps():
    """A 14x14 map's 3x3 conv stays on Winograd F(2x2) (faster than the direct kernel there); the 1x1 goes direct."""
    m = _block(32, 64, (14, 14), 3, 1, [1, 1, 1, 1], "relu")
    report = optimize(import_onnx(m).mod, CompileOptions.make(target="llvm -mcpu=sapphirerapids")).report
    assert report["winograd_convs"] == 1 and report["f32_kernel_convs"] == 1
