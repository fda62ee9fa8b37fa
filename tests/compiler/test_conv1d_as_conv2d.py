"""Conv1dAsConv2d: a 1-D conv runs as a height-1 conv2d, channel-blocked like any conv2d, and gives
onnxruntime's numbers for every attribute a speech model's convs use (stride, dilation, asymmetric
padding, groups, a bias and ReLU after it)."""

import numpy as np
import pytest
from helpers import check_against_ort, make_model, rand
from onnx import helper

from kiln.compiler.passes import Conv1dAsConv2d

pytestmark = pytest.mark.filterwarnings("error::kiln.errors.KilnWarning")  # a failed optional pass is skipped


def _conv1d_model(c_in, c_out, width, k, groups=1, **attrs):
    x = rand(1, c_in, width)
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], kernel_shape=[k], group=groups, **attrs),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["output"], kernel_shape=[1]),
    ]
    inits = {
        "w": rand(c_out, c_in // groups, k, seed=1) * 0.3,
        "b": rand(c_out, seed=2),
        "w2": rand(16, c_out, 1, seed=3) * 0.3,
    }
    return make_model(nodes, {"input": x}, ["output"], inits), x


@pytest.mark.parametrize(
    "c_in,c_out,width,k,groups,attrs",
    [
        (1, 32, 400, 10, 1, {"strides": [5]}),  # wav2vec2's first conv: one input channel, stride 5
        (32, 32, 79, 3, 1, {"pads": [1, 1]}),
        (32, 64, 50, 3, 1, {"pads": [2, 0], "dilations": [2]}),  # asymmetric padding, dilated
        (32, 32, 40, 5, 16, {"pads": [2, 2]}),  # grouped (wav2vec2's positional conv)
        (24, 40, 33, 3, 1, {"strides": [2], "pads": [1, 1]}),  # channels that do not block by 16
    ],
)
def test_conv1d_matches_onnxruntime(tmp_path, c_in, c_out, width, k, groups, attrs):
    model, x = _conv1d_model(c_in, c_out, width, k, groups, **attrs)
    check_against_ort(model, {"input": x}, tmp_path)


def test_conv1d_runs_as_a_blocked_conv2d():
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx

    model, _ = _conv1d_model(32, 32, 64, 3, pads=[1, 1])
    opt = optimize(import_onnx(model).mod, CompileOptions.make(target="llvm -mcpu=znver4"))
    assert opt.report["conv1d_as_conv2d"] == 2
    assert opt.report["conv_layouts"] == {"NCHW16c": 2}, opt.report["conv_layouts"]
    nchw = optimize(import_onnx(model).mod, CompileOptions.make(target="llvm -mcpu=znver4", layout="NCHW"))
    assert nchw.report.get("conv1d_as_conv2d", 0) == 0  # NCHW keeps TVM's conv1d (a height-1 NCHW conv
    # would run on one core: its NCHW rule parallelizes over rows)


def test_pass_counts_and_keeps_other_convs():
    model, _ = _conv1d_model(8, 8, 20, 3, pads=[1, 1])
    from kiln.frontends.importer import import_onnx

    p = Conv1dAsConv2d()
    mod = p(import_onnx(model).mod)
    assert p.stats["conv1d_as_conv2d"] == 2
    assert "relax.nn.conv1d" not in mod.script()
    stft, _ = _conv1d_model(1, 258, 64, 16, strides=[8])  # silero's STFT: neither channel count blocks
    p = Conv1dAsConv2d()
    p(import_onnx(stft).mod)
    # only the 258 -> 16 conv after it: 16 output channels vectorize (258 = 2 x 129 blocks by 2 at most);
    # the STFT itself, 7 frames of 16 samples, is a matmul of the gathered frames
    assert p.stats["conv1d_as_conv2d"] == 1 and p.stats["conv1d_as_matmul"] == 1


@pytest.mark.parametrize(
    "c_in,c_out,width,k,attrs",
    [
        (1, 258, 640, 256, {"strides": [128]}),  # silero's STFT: 4 frames
        (1, 130, 320, 128, {"strides": [64]}),  # its 8 kHz STFT
        (65, 20, 4, 3, {"pads": [1, 1]}),  # 65 bins (silero 8 kHz) to 20 channels: neither blocks
        (3, 10, 30, 5, {"strides": [3], "pads": [2, 1], "dilations": [2]}),
    ],
)
def test_unblockable_conv1d_over_few_positions_is_a_matmul(tmp_path, c_in, c_out, width, k, attrs):
    from kiln.frontends.importer import import_onnx

    model, x = _conv1d_model(c_in, c_out, width, k, **attrs)
    p = Conv1dAsConv2d()
    p(import_onnx(model).mod)
    assert p.stats["conv1d_as_matmul"] == 1
    check_against_ort(model, {"input": x}, tmp_path)


def test_a_chain_of_conv1d_stays_blocked_between_convs(tmp_path):
    """conv -> bias -> relu -> conv -> + residual -> conv: no layout transform between the convs."""
    x = rand(1, 32, 48)
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["m"]),
        helper.make_node("Conv", ["m", "w3"], ["output"], kernel_shape=[1]),
    ]
    inits = {
        "w1": rand(32, 32, 3, seed=1) * 0.2,
        "b1": rand(32, seed=2),
        "w2": rand(32, 32, 3, seed=3) * 0.2,
        "scale": rand(32, 1, seed=4),
        "w3": rand(32, 32, 1, seed=5) * 0.2,
    }
    model = make_model(nodes, {"input": x}, ["output"], inits)
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx

    opt = optimize(import_onnx(model).mod, CompileOptions.make(target="llvm -mcpu=znver4"))
    assert opt.report["conv1d_as_conv2d"] == 3
    assert opt.report["layout_transforms"] == 2, opt.report["layout_transforms"]  # in once, out once
    check_against_ort(model, {"input": x}, tmp_path)


def test_erf_gelu_between_conv1d_stays_blocked_and_fuses(tmp_path):
    """Regression (wav2vec2's feature encoder, Whisper's stem): GELU as TorchScript exports it before opset 20,
    x * 0.5 * (1 + erf(x / sqrt(2))), after a conv1d went back to NCHW at the erf (four layout transforms per
    conv, none of the chain fused into the conv). erf is elementwise: the chain stays blocked and fuses."""
    x = rand(1, 32, 64)
    nodes = [helper.make_node("Conv", ["input", "w1"], ["c0"], kernel_shape=[3], strides=[2])]
    for i in range(2):
        c = f"c{i}"
        nodes += [
            helper.make_node("Div", [c, "sqrt2"], [f"d{i}"]),
            helper.make_node("Erf", [f"d{i}"], [f"e{i}"]),
            helper.make_node("Add", [f"e{i}", "one"], [f"a{i}"]),
            helper.make_node("Mul", [c, f"a{i}"], [f"m{i}"]),
            helper.make_node("Mul", [f"m{i}", "half"], [f"g{i}"]),
        ]
        nodes.append(
            helper.make_node(
                "Conv", [f"g{i}", f"w{i + 2}"], [f"c{i + 1}" if i == 0 else "output"], kernel_shape=[3], strides=[2]
            )
        )
    inits = {
        "w1": rand(32, 32, 3, seed=1) * 0.2,
        "w2": rand(32, 32, 3, seed=2) * 0.2,
        "w3": rand(32, 32, 3, seed=3) * 0.2,
        "sqrt2": np.array(1.4142135, np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    model = make_model(nodes, {"input": x}, ["output"], inits)
    from kiln.compiler.optimize import optimize
    from kiln.compiler.options import CompileOptions
    from kiln.frontends.importer import import_onnx

    opt = optimize(import_onnx(model).mod, CompileOptions.make(target="llvm -mcpu=znver4"))
    assert opt.report["conv1d_as_conv2d"] == 3
    assert opt.report["layout_transforms"] == 2, opt.report["layout_transforms"]  # in once, out once
    names = [gv.name_hint for gv in opt.mod.functions]
    # each GELU in its conv's epilogue: TVM's fused conv2d + erf, or (AVX-512) the fp32 conv kernel's GELU
    fused = [n for n in names if ("conv2d" in n and "erf" in n) or n.startswith("kiln_f32_conv_gelu")]
    assert len(fused) == 2, names
    check_against_ort(model, {"input": x}, tmp_path)


def test_bf16_conv1d_runs_on_the_bf16_conv_kernel(tmp_path):
    """Structural (any host): Conv1dAsConv2d runs before MixedPrecision, so a speech front-end's 1-D convs
    (Whisper's 80 -> 384, k 3) become bf16 conv2ds that BF16ConvKernel takes, not float32 conv1ds."""
    import kiln

    model, _ = _conv1d_model(80, 384, 60, 3, pads=[1, 1])
    r = kiln.compile(model, tmp_path / "m.kiln", precision="bf16", target="llvm -mcpu=znver4")
    assert r.report["bf16_kernel_convs"] == 2
