"""The optimization report: the ResNet-50 claims, the CLI outputs, and pipeline options."""

import json
import re

import onnx
import pytest

import kiln
from kiln import zoo
from kiln.cli import main
from kiln.compiler.backends import CPU
from kiln.compiler.build import analyze_model

KEYS = {
    "ops_before",
    "ops_after",
    "kernels",
    "fused_groups",
    "batchnorm_total",
    "batchnorm_folded",
    "constants_folded",
    "noops_removed",
    "layout_transforms",
    "weights_bytes",
    "activation_bytes_naive",
    "activation_bytes_planned",
    "buffers_planned",
    "pass_seconds",
}


@pytest.fixture(scope="module")
def resnet50_report():
    # structural: pinned to an AVX-512 CPU (16 fp32 lanes) so the layout counts hold on any host; nothing runs
    return analyze_model(zoo.resnet50(), input_shapes=["input:1x3x224x224"], target="llvm -mcpu=znver4")


def test_resnet50_claims(resnet50_report):
    r = resnet50_report
    assert KEYS <= set(r)
    assert r["batchnorm_total"] == 53 and r["batchnorm_folded"] == 53
    assert "nn.batch_norm" in r["ops_before"] and "nn.batch_norm" not in r["ops_after"]
    # every conv + bias + ReLU (+ residual add) is one kernel: 53 conv kernels. On AVX-512 41 of them run on Kiln's
    # fp32 conv kernel (F32ConvKernel) with the bias, residual and ReLU in its epilogue (FuseBF16Epilogue: named
    # kiln_f32_conv[_add][_relu]); the Winograd convs and the 3-channel stem are TVM kernels fused with theirs
    assert r["f32_kernel_convs"] == 41 and r["bf16_epilogues_fused"] == 41
    convs = [g for g in r["fused_groups"] if "conv2d" in g["name"]]
    assert sum(g["calls"] for g in convs) == 12
    assert all(re.search(r"conv2d\d*_relax_add(_relax_add)?(_relax_nn_relu)?\d*$", g["name"]) for g in convs), convs
    # the 3x3 stride-1 convs run as Winograd kernels: F(4x4, 3x3) at 56x56 and 28x28, F(2x2, 3x3) at 14x14; the
    # 7x7 ones (F(2x2) on 16 tiles) direct, on the fp32 conv kernel (Winograd small_direct)
    assert (
        r["winograd_convs"] == 11 and r["ops_after"]["nn.conv2d_winograd"] == 11 and r["ops_after"]["nn.conv2d"] == 42
    )
    assert sum(g["calls"] for g in convs if "winograd" in g["name"]) == 11
    assert all("relu" in g["name"] for g in convs)  # the stem and the Winograd convs: all in front of a ReLU
    # NCHWc (the default): the 3-channel stem reads NCHW1c (a reshape of the input) and writes NCHW16c, so the
    # max pool runs blocked; the input and the global pool's input each take one layout transform (the counts
    # are of the graph after all graph passes)
    assert r["conv_layouts"] == {"NCHW1c": 1, "NCHW16c": 52}
    # the three stride-2 1x1 shortcuts read a strided slice of their input (SubsampleStridedPointwise): 3 kernels
    assert r["strided_pointwise_subsampled"] == 3
    # + 1: the classifier's 1000 columns run on the fp32 matmul kernel padded to 1008, then sliced back
    assert r["layout_transforms"] == 2 and r["kernels"] == 57 + 2 + 3 + 1 and r["f32_kernel_matmuls"] == 1
    assert r["kernels_scheduled"] > 0 and r["kernels_unscheduled"] == 0
    assert r["activation_bytes_planned"] <= r["activation_bytes_naive"] / 4
    assert r["activation_bytes_naive"] < r["activation_bytes_unfused"]
    # 25.5 M fp32 parameters (102 MB), and the Winograd convs store their weights transformed:
    # 36/9 (F(4x4, 3x3): 3 x 64 and 3 x 128 channels) or 16/9 (F(2x2, 3x3): 5 x 256) as many
    extra = sum(n * c * c * 4 * (t - 9) for n, c, t in ((3, 64, 36), (3, 128, 36), (5, 256, 16)))
    assert 100e6 + extra < r["weights_bytes"] < 104e6 + extra
    assert r["pass_seconds"]["FoldBatchNorm"] > 0


def test_compile_report_and_inspect_passes(tmp_path, capsys):
    model = tmp_path / "r18.onnx"
    onnx.save(zoo.resnet18(size=32, classes=10), model)
    report = tmp_path / "report.json"
    assert (
        main(
            [
                "compile",
                str(model),
                "-o",
                str(tmp_path / "m.kiln"),
                "--input-shape",
                "input:1x3x32x32",
                "--report",
                str(report),
            ]
        )
        == 0
    )
    r = json.loads(report.read_text())
    assert KEYS <= set(r) and r["batchnorm_folded"] == r["batchnorm_total"] == 20 and "tvm.compile" in r["pass_seconds"]
    capsys.readouterr()
    assert main(["inspect", "--passes", str(model), "--input-shape", "input:1x3x32x32"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"batchnorm folded\s+20 / 20", out) and re.search(
        r"kernels\s+29 ", out
    )  # 24 + 3 strided slices (the stride-2 shortcuts' inputs) + 2 layout transforms
    assert (
        main(
            [
                "inspect",
                "--passes",
                str(model),
                "--input-shape",
                "input:1x3x32x32",
                "--disable-pass",
                "FoldBatchNorm",
                "--json",
            ]
        )
        == 0
    )
    r2 = json.loads(capsys.readouterr().out)
    assert r2["batchnorm_folded"] == 0 and r2["kernels"] > 27  # unfolded BN breaks epilogue fusion
    assert (
        main(["inspect", "--passes", str(model), "--input-shape", "input:1x3x32x32", "--opt-level", "0", "--json"]) == 0
    )
    r0 = json.loads(capsys.readouterr().out)
    assert r0["kernels"] > 60 and r0["epilogues_fused"] == 0


def test_pass_options_are_validated(small_conv_model, tmp_path):
    with pytest.raises(kiln.OptionsError, match="passes are: StaticDataflow, ClipTakeIndices, LowerQDQ, "):
        kiln.compile(small_conv_model, tmp_path / "m.kiln", input_shapes=["input:1x3x8x8"], disabled_passes=["FoldBN"])
    with pytest.raises(kiln.OptionsError, match="cannot be disabled"):
        kiln.compile(
            small_conv_model, tmp_path / "m.kiln", input_shapes=["input:1x3x8x8"], disabled_passes=["LegalizeOps"]
        )
    with pytest.raises(kiln.OptionsError, match="use one of"):
        kiln.compile(small_conv_model, tmp_path / "m.kiln", input_shapes=["input:1x3x8x8"], layout="NC")
    with pytest.raises(kiln.OptionsError, match="opt level"):
        kiln.compile(small_conv_model, tmp_path / "m.kiln", input_shapes=["input:1x3x8x8"], opt_level=7)


def test_pipeline_is_a_list_per_target():
    names = [s.name for s in CPU.pipeline(2)]
    assert names[:6] == [
        "StaticDataflow",
        "ClipTakeIndices",
        "LowerQDQ",
        "FoldQDQPairs",
        "FoldConstants",
        "CanonicalizeClip",
    ]
    assert [s.name for s in CPU.pipeline(0)] == [
        n
        for n in names
        if n
        in (
            "StaticDataflow",
            "ClipTakeIndices",
            "DecomposeOpsForInference",
            "LegalizeOps",
            "AnnotateTIROpPattern",
            "FuseTIR",
            "DeadCodeElimination",
            "ApplyTuningDatabase",
        )
    ]
    assert "FuseEpilogue" not in [s.name for s in CPU.pipeline(2, ("FuseEpilogue",))]
    assert set(CPU.pass_names()) >= set(names)


def test_layout_auto_measures_both_and_records_the_choice(tmp_path):
    r = kiln.compile(
        zoo.resnet18(size=32, classes=10), tmp_path / "m.kiln", input_shapes=["input:1x3x32x32"], layout="auto"
    )
    cands = r.report["layout_candidates_ms"]
    assert set(cands) == {"NCHW", "NHWC", "NCHWc"} and all(v > 0 for v in cands.values())
    assert r.manifest["compile_options"]["layout_chosen"] == min(cands, key=cands.get) == r.report["layout"]
    assert r.manifest["compile_options"]["layout"] == "auto"
