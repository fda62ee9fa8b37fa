"""PropagateBlockedLayout: MobileNet blocks run their depthwise conv, bias and clip in NCHW16c,
with the layout transforms TVM's ConvertLayout leaves around them cancelled. NarrowBlockLayout:
convs whose channels do not divide 16 (MobileNetV2's 24) run in NCHW8c, with no transforms either."""

import numpy as np
import pytest
import tvm
from helpers import check_against_ort, make_model, mobilenet_block, quantize_dynamic, rand
from onnx import helper

from kiln.compiler import CompileOptions, analysis
from kiln.compiler.passes.convert_layout import count_layout_transforms
from kiln.frontends import import_onnx


def _graph_passes(model, disabled=()):
    co = CompileOptions.make(
        target="llvm -mcpu=znver4", disabled_passes=disabled
    )  # AVX-512: 16-lane blocks (graph passes only, nothing runs)
    mod = import_onnx(model, {}).mod
    stats = {}
    with co.target.tvm(), tvm.transform.PassContext(opt_level=3):
        for spec in co.backend.pipeline(2, co.disabled_passes):
            if not spec.graph:
                break
            p = spec.make(co)
            if p is None:  # rows that only run when asked (Quantize, MixedPrecision)
                continue
            mod = p(mod)
            stats.update(getattr(p, "stats", {}))
    return mod, stats


def test_depthwise_runs_blocked_and_transforms_cancel():
    mod, stats = _graph_passes(mobilenet_block())
    assert stats["transforms_moved"] > 0
    assert analysis.conv_layouts(mod) == {"NCHW16c": 3}  # the depthwise conv too (fused groups included)
    assert count_layout_transforms(mod) == 2  # into the block at the input, out at the output
    before, _ = _graph_passes(mobilenet_block(), disabled=("PropagateBlockedLayout",))
    assert count_layout_transforms(before) > 2


@pytest.mark.parametrize("stride, multiplier", [(1, 1), (2, 1), (1, 2)])
def test_mobilenet_block_matches_onnxruntime(tmp_path, stride, multiplier):
    model = mobilenet_block(stride, multiplier)
    check_against_ort(model, {"x": rand(1, 16, 14, 14, seed=9)}, tmp_path, rtol=1e-4, atol=1e-4)


def narrow_stage():
    """MobileNetV2's 24-channel stage, shrunk: 32 -> 24 project (NCHW16c in, 8c out), then an
    inverted residual on 24 channels (24 -> 72 -> depthwise 72 -> 24, + residual; 72 = 9 x 8),
    then 24 -> 32 (8c in, 16c out)."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["a"]),
        helper.make_node("Conv", ["a", "w1", "b1"], ["e"]),
        helper.make_node("Clip", ["e", "lo", "hi"], ["e6"]),
        helper.make_node("Conv", ["e6", "wd", "bd"], ["d"], group=72, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
        helper.make_node("Conv", ["d6", "w2", "b2"], ["p"]),
        helper.make_node("Add", ["p", "a"], ["r"]),
        helper.make_node("Conv", ["r", "w3", "b3"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2], kernel_shape=[3, 3]),
    ]
    inits = {
        "w0": rand(24, 32, 1, 1, seed=1) * 0.3,
        "b0": rand(24, seed=2),
        "w1": rand(72, 24, 1, 1, seed=3) * 0.3,
        "b1": rand(72, seed=4),
        "wd": rand(72, 1, 3, 3, seed=5) * 0.3,
        "bd": rand(72, seed=6),
        "w2": rand(24, 72, 1, 1, seed=7) * 0.3,
        "b2": rand(24, seed=8),
        "w3": rand(32, 24, 3, 3, seed=9) * 0.2,
        "b3": rand(32, seed=10),
        "lo": np.array(0, np.float32),
        "hi": np.array(6, np.float32),
    }
    return make_model(nodes, {"x": rand(1, 32, 14, 14)}, ["y"], inits)


def test_narrow_channels_run_blocked_by_8_with_no_transforms():
    mod, stats = _graph_passes(narrow_stage())
    assert stats["convs_blocked"] == 4  # the four group-1 convs that touch 24 or 72 channels
    assert analysis.conv_layouts(mod) == {"NCHW16c": 1, "NCHW8c": 4}  # data layouts: 32 -> 24 reads 16c
    assert count_layout_transforms(mod) == 2  # into the block at the input, out at the output
    before, _ = _graph_passes(narrow_stage(), disabled=("NarrowBlockLayout",))
    assert analysis.conv_layouts(before) == {"NCHW": 5}  # none of these convs divides 16 on both sides


@pytest.mark.parametrize("disabled", [(), ("NarrowBlockLayout",)], ids=["narrow", "nchw"])
def test_narrow_stage_matches_onnxruntime(tmp_path, disabled):
    check_against_ort(
        narrow_stage(), {"x": rand(1, 32, 14, 14, seed=11)}, tmp_path, rtol=1e-4, atol=1e-4, disabled_passes=disabled
    )


def detection_heads():
    """A RetinaNet-style head (3x3 convs to 9 x 4 = 36 box outputs, and a shared-weight class conv at two
    levels) and a YOLO head (1x1 conv to 3 x 85 = 255 outputs), each with its bias and activation."""
    nodes = [
        helper.make_node("Conv", ["x", "wb", "bb"], ["box"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wc", "bc"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c0"], ["cls0"]),
        helper.make_node("MaxPool", ["x"], ["x2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["x2", "wc", "bc"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["cls1"]),
        helper.make_node("Conv", ["x", "wy", "by"], ["y0"]),
        helper.make_node("Relu", ["y0"], ["yolo"]),
    ]
    inits = {
        "wb": rand(36, 32, 3, 3, seed=1) * 0.1,
        "bb": rand(36, seed=2),
        "wc": rand(819, 32, 3, 3, seed=3) * 0.1,
        "bc": rand(819, seed=4),
        "wy": rand(255, 32, 1, 1, seed=5) * 0.1,
        "by": rand(255, seed=6),
    }
    return make_model(nodes, {"x": rand(1, 32, 12, 12)}, ["box", "cls0", "cls1", "yolo"], inits)


def test_detection_heads_get_zero_filters_to_a_blockable_count():
    """819 -> 832 and 255 -> 256 (16-channel blocks), 36 -> 40 (8): each conv, the class conv at both
    levels, runs blocked instead of on the generic NCHW schedule (RetinaNet 289 -> 103 ms)."""
    mod, stats = _graph_passes(detection_heads())
    assert stats["convs_padded"] == 4
    assert analysis.conv_layouts(mod) == {"NCHW16c": 4}  # data layouts: 32 input channels block by 16
    before, _ = _graph_passes(detection_heads(), disabled=("NarrowBlockLayout",))
    assert analysis.conv_layouts(before) == {"NCHW": 4}


def test_detection_heads_match_onnxruntime(tmp_path):
    check_against_ort(detection_heads(), {"x": rand(1, 32, 12, 12, seed=11)}, tmp_path, rtol=1e-4, atol=1e-4)


def stem_and_pool(op: str):
    """A 3x3 stem (NarrowBlockLayout blocks it: NCHW1c in, 16c out), a pool TVM's ConvertLayout left in NCHW
    because its producer was NCHW when it ran, and a residual conv block after it (a small ResNet)."""
    pool = {"MaxPool": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}}.get(op, {})
    pool = pool or {"kernel_shape": [2, 2], "strides": [2, 2], "count_include_pad": 0}
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["s"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node(op, ["r"], ["p"], **pool),
        helper.make_node("Conv", ["p", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "p"], ["y"]),
    ]
    inits = {"w0": rand(16, 3, 3, 3, seed=1), "b0": rand(16, seed=2), "w1": rand(16, 16, 3, 3, seed=3) * 0.2}
    inits["b1"] = rand(16, seed=4)
    return make_model(nodes, {"x": rand(1, 3, 32, 32, seed=5)}, ["y"], inits)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_after_a_blocked_stem_runs_blocked(tmp_path, op):
    """The pool runs NCHW16c and the residual stream after it has no transforms (in a QDQ ResNet-18 the NCHW
    pool after the int8 stem put two transforms around every layer1 block: 5.84 vs 6.62 ms on Zen 4)."""
    mod, stats = _graph_passes(stem_and_pool(op))
    assert stats["convs_blocked"] == 1 and count_layout_transforms(mod) == 2  # the input's and the output's
    before, _ = _graph_passes(stem_and_pool(op), disabled=("PropagateBlockedLayout",))
    assert count_layout_transforms(before) > 2
    check_against_ort(stem_and_pool(op), {"x": rand(1, 3, 32, 32, seed=5)}, tmp_path, rtol=1e-4, atol=1e-4)


def dynamic_quantized_convs(tmp_path):
    """onnxruntime's quantize_dynamic over a SiLU conv stack (ddddocr's OCR models ship so): each conv is
    DynamicQuantizeLinear (a min/max over the whole tensor) -> ConvInteger -> Cast -> Mul by the run-time
    scale, the bias and SiLU after it."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Sigmoid", ["c0"], ["g0"]),
        helper.make_node("Mul", ["c0", "g0"], ["s0"]),
        helper.make_node("Conv", ["s0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["g1"]),
        helper.make_node("Mul", ["c1", "g1"], ["s1"]),
        helper.make_node("Conv", ["s1", "w2", "b2"], ["y"]),
    ]
    inits = {"w0": rand(32, 16, 3, 3, seed=1) * 0.2, "b0": rand(32, seed=2), "w1": rand(32, 32, 3, 3, seed=3) * 0.1}
    inits.update({"b1": rand(32, seed=4), "w2": rand(32, 32, 1, 1, seed=5) * 0.2, "b2": rand(32, seed=6)})
    model = make_model(nodes, {"x": rand(1, 16, 16, 16)}, ["y"], inits)
    return quantize_dynamic(model, tmp_path, weight_type="QUInt8", op_types_to_quantize=["Conv"])


def test_dynamic_quantized_convs_stay_blocked(tmp_path):
    """The run-time scale, the bias computed from it and the min/max of the next quantization all take the
    blocked layout: no transforms between the convs (ddddocr_common_old had two around each of its 21 convs,
    57 in all; 10.9 -> 7.2 ms on Zen 4) and the outputs equal onnxruntime's."""
    q = dynamic_quantized_convs(tmp_path)
    assert sum(n.op_type == "ConvInteger" for n in q.graph.node) == 3
    mod, stats = _graph_passes(q)
    assert analysis.conv_layouts(mod) == {"NCHW16c": 3}
    assert count_layout_transforms(mod) == 2  # the input's and the output's
    before, _ = _graph_passes(q, disabled=("PropagateBlockedLayout",))
    assert count_layout_transforms(before) >= 6
    check_against_ort(q, {"x": rand(1, 16, 16, 16, seed=7)}, tmp_path, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
def test_a_reduction_to_one_value_reads_the_blocked_tensor(tmp_path, op):
    """A whole-tensor mean or sum of a conv's output (a gate's statistic) reads NCHW16c: no transform back to NCHW
    for it, and its kernel scheduled (the default rule once failed on it, rules.full_reduction)."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(op, ["c"], ["m"], keepdims=0),
        helper.make_node("Mul", ["c", "m"], ["y"]),
    ]
    model = make_model(nodes, {"x": rand(1, 16, 8, 8)}, ["y"], {"w": rand(32, 16, 3, 3, seed=1) * 0.2})
    mod, _ = _graph_passes(model)
    assert count_layout_transforms(mod) == 2  # the input's and the output's
    ours = check_against_ort(model, {"x": rand(1, 16, 8, 8, seed=2)}, tmp_path)
    assert ours["y"].shape == (1, 32, 8, 8)


def test_padded_channels_add_at_most_a_quarter():
    """A conv's output channels no 8-lane block divides are padded where that adds at most a quarter: a DCN's
    27 offset and mask channels to 32 (its NCHW conv ran at 9-16% of the FMA peak, ResNet-18-DCN 0.91x with
    them padded), a 21-class head to 24; a 6-channel output would grow by a third and stays."""
    from kiln.compiler.passes.narrow_block_layout import padded_channels

    assert [padded_channels(o, 16) for o in (819, 255, 36, 27, 21, 7, 6, 1)] == [832, 256, 40, 32, 24, 8, 6, 1]
