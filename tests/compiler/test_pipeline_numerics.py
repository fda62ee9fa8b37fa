"""Numerics of the zoo models against onnxruntime with every optional pass disabled in turn (the
all-passes case at full size is tests/test_zoo.py). Small input sizes keep it fast; NHWC so that
ConvertLayout has work to do."""

import numpy as np
import pytest
from helpers import default_caps, ort_run

import kiln
from kiln import zoo
from kiln.compiler.backends.cpu import ROWS as CPU_PIPELINE

# passes with work to do on these float models in NHWC (the quantized and bf16 builds' passes act only on
# quantized models or when asked: tests/compiler/test_quantize.py, test_bf16_epilogue.py, test_fold_qdq_pairs.py,
# test_int8_residuals.py, test_hoist_quantize.py, test_hoist_bf16_casts.py, test_space_to_depth_stem.py; the
# NCHWc-only passes are disabled in turn in tests/compiler/test_propagate_layout.py, test_winograd.py and
# test_block_grouped_conv.py)
QUANT_ROWS = (
    "LowerQDQ",
    "FoldQDQPairs",
    "Quantize",
    "Int8Residuals",
    "HoistQuantize",
    "SpaceToDepthStem",
    "MixedPrecision",
    "BF16ConvKernel",
    "HoistBF16Casts",
    "BF16Residuals",
    "FuseBF16Epilogue",
)
NCHWC_ROWS = ("NarrowBlockLayout", "BlockGroupedConv", "PropagateBlockedLayout", "Winograd")
# nothing to rewrite in these models: no conv1d (tests/compiler/test_conv1d_as_conv2d.py), no conv reading
# mostly padding (test_drop_dead_conv_taps.py), no ConvTranspose (test_conv_transpose_as_conv.py), no Resize
# (test_resize_as_matmul.py)
OTHER_ROWS = ("Conv1dAsConv2d", "DropDeadConvTaps", "ConvTransposeAsConv", "ResizeAsMatmul")
OPTIONAL = list(
    dict.fromkeys(s.name for s in CPU_PIPELINE if not s.required and s.name not in QUANT_ROWS + NCHWC_ROWS + OTHER_ROWS)
)
# MobileNetV2 (52 convs: the slowest of the three to compile) is built with the passes disabled that act on
# what it has and the other two lack (depthwise convs, ReLU6 clips, batchnorms after depthwise convs); the
# passes that act on every model the same way are disabled in turn on ResNet-18 and the transformer.
# (ConvertLayout and FuseEpilogue act on ResNet-18's convs the same way)
MOBILENET_ROWS = ("FoldBatchNorm", "CanonicalizeClip", "FuseDepthwisePointwise")
# rows with nothing to act on in a model are not disabled on it: ResNet-18 has no depthwise conv and no clip
# (MobileNetV2 has both) and no sibling matmuls, the transformer no conv, batchnorm or clip
CONV_ROWS = ("FoldBatchNorm", "RemoveZeroChannels", "ConvertLayout", "FuseDepthwisePointwise", "CanonicalizeClip")
IDLE = {
    "resnet18": ("FuseDepthwisePointwise", "CanonicalizeClip", "MergeSiblingMatmuls"),  # no matmuls sharing an input
    "transformer_encoder": CONV_ROWS,
}
CASES = [
    (name, d)
    for name in ("resnet18", "mobilenet_v2", "transformer_encoder")
    for d in [()] + [(p,) for p in OPTIONAL]
    if (name != "mobilenet_v2" or not d or d[0] in MOBILENET_ROWS) and not (d and d[0] in IDLE.get(name, ()))
]
SMALL = {
    "resnet18": (lambda: zoo.resnet18(size=32, classes=10), "input:1x3x32x32"),
    "mobilenet_v2": (lambda: zoo.mobilenet_v2(size=32, classes=10), "input:1x3x32x32"),
    "transformer_encoder": (lambda: zoo.transformer_encoder(d_model=32, heads=2, layers=1, ffn=64), "input:1x8x32"),
    "resnet50": (lambda: zoo.resnet50(size=32, classes=10), "input:1x3x32x32"),
}


def _check(tmp_path, name, disabled):
    build, shape = SMALL[name]
    model = build()
    kiln.compile(model, tmp_path / "m.kiln", input_shapes=[shape], disabled_passes=disabled, layout="NHWC")
    m = kiln.load(tmp_path / "m.kiln")
    x = np.random.default_rng(3).standard_normal(m.inputs[0].shape).astype(np.float32)
    np.testing.assert_allclose(m.run({"input": x})["output"], ort_run(model, {"input": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,disabled", CASES, ids=[f"{'+'.join(d) or 'all_on'}-{name}" for name, d in CASES])
def test_each_pass_disabled_in_turn(tmp_path, name, disabled):
    _check(tmp_path, name, disabled)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_nchwc_layout(tmp_path, name):
    build, shape = SMALL[name]
    model = build()
    r = kiln.compile(model, tmp_path / "m.kiln", input_shapes=[shape], layout="NCHWc")
    # the block is the host's float32 vector (16 on AVX-512, 8 on AVX2, 4 on NEON). ResNet-18: all 20, its
    # 3-channel 7x7 stem reading NCHW1c (NarrowBlockLayout); MobileNetV2: all 52, its 3x3 stem too, with 16-wide
    # blocks the two convs reading 24 channels in NCHW8c (NarrowBlockLayout), the depthwise convs in the
    # layout of their input (PropagateBlockedLayout); transforms only at the ends
    b = default_caps().f32_block
    wide = f"NCHW{b}c"
    expected = {
        "resnet18": {"NCHW1c": 1, wide: 19},
        "mobilenet_v2": {"NCHW1c": 1, "NCHW8c": 2, wide: 49} if b == 16 else {"NCHW1c": 1, wide: 51},
    }[name]
    assert r.report["layout"] == "NCHWc" and r.report["conv_layouts"] == expected
    assert r.report["layout_transforms"] == 2
    m = kiln.load(tmp_path / "m.kiln")
    x = np.random.default_rng(3).standard_normal(m.inputs[0].shape).astype(np.float32)
    np.testing.assert_allclose(m.run({"input": x})["output"], ort_run(model, {"input": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("disabled", [()] + [(p,) for p in OPTIONAL], ids=lambda d: "+".join(d) or "all_on")
def test_resnet50_each_pass_disabled_in_turn(tmp_path, disabled):
    _check(tmp_path, "resnet50", disabled)
