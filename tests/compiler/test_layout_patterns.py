"""Kiln's default NCHWc layout on the graph patterns of published models that TVM's ConvertLayout
broke (kiln/compiler/passes/layout_guards.py says which op tripped which check): FPN/DBNet
upsampling pyramids, YOLOv8's C2f split/concat, ShuffleNet's grouped convs and channel shuffle,
Conv1d over embeddings, NHWC inputs, ConvNeXt's LayerNorm over channels, Swin's windowed attention,
each with odd channel counts, and the single ops the guards cover. Each compiles with the default
options, matches onnxruntime, and keeps its convs blocked: the structure is checked on a pinned
target (16-lane blocks whatever the host), the numerics on the host."""

import numpy as np
import pytest
import tvm
from helpers import check_against_ort, make_model, ort_run, rand
from onnx import helper

import kiln
from kiln.compiler import CompileOptions, analysis
from kiln.compiler.passes.convert_layout import count_layout_transforms
from kiln.frontends import import_onnx

TARGET = "llvm -mcpu=znver4"  # AVX-512: NCHW16c, and NarrowBlockLayout's NCHW8c for channels 16 does not divide
N = helper.make_node


def W(*shape, seed=0):
    """Weights of unit gain (1/sqrt(fan-in)): outputs stay near 1, so rtol/atol 1e-4 catch layout
    errors, not float32 rounding."""
    scale = 1 / np.sqrt(np.prod(shape[1:])) if len(shape) > 1 else 0.2
    return (rand(*shape, seed=seed) * scale).astype(np.float32)


def i64(*v):
    return np.array(v, np.int64)


def f32(*v):
    return np.array(v, np.float32)


def _model(nodes, x, inits, opset=17):
    return make_model(nodes, {"x": x}, ["y"], inits, opset=opset), {"x": rand(*x.shape, seed=20)}


def fpn(c):
    """Two stride-2 convs, 1x1 laterals, nearest Resize x2 + add, a ConvTranspose x2, a linear Resize
    and a x4 Resize of the top map, concatenated and fused by a 3x3 conv."""
    nodes = [
        N("Conv", ["x", "w0", "b0"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        N("Conv", ["c1", "w1", "b1"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        N("Conv", ["c2", "wl2", "bl2"], ["l2"]),
        N("Conv", ["c1", "wl1", "bl1"], ["l1"]),
        N("Resize", ["l2", "", "sc2"], ["u2"], mode="nearest"),
        N("Add", ["u2", "l1"], ["p1"]),
        N("ConvTranspose", ["p1", "wt", "bt"], ["t1"], strides=[2, 2], kernel_shape=[2, 2]),
        N("Resize", ["p1", "", "sc2"], ["u1"], mode="linear"),
        N("Resize", ["l2", "", "sc4"], ["u2b"], mode="nearest"),
        N("Concat", ["t1", "u1", "u2b"], ["cat"], axis=1),
        N("Conv", ["cat", "wo", "bo"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = {
        "w0": W(2 * c, 3, 3, 3, seed=1),
        "b0": W(2 * c, seed=2),
        "w1": W(4 * c, 2 * c, 3, 3, seed=3),
        "b1": W(4 * c, seed=4),
        "wl2": W(c, 4 * c, 1, 1, seed=5),
        "bl2": W(c, seed=6),
        "wl1": W(c, 2 * c, 1, 1, seed=7),
        "bl1": W(c, seed=8),
        "wt": W(c, c, 2, 2, seed=9),
        "bt": W(c, seed=10),
        "wo": W(c, 3 * c, 3, 3, seed=11),
        "bo": W(c, seed=12),
        "sc2": f32(1, 1, 2, 2),
        "sc4": f32(1, 1, 4, 4),
    }
    return _model(nodes, rand(1, 3, 32, 32), inits)


def c2f(c, use_slice=False):
    """YOLOv8's C2f: conv + SiLU -> Split(2) (or two Slices) -> a residual bottleneck on one half ->
    Concat of both halves and the bottleneck -> 1x1 conv."""
    h = c // 2
    nodes = [N("Conv", ["x", "w0", "b0"], ["a"]), N("Sigmoid", ["a"], ["as"]), N("Mul", ["a", "as"], ["a0"])]
    if use_slice:
        nodes += [N("Slice", ["a0", "s0", "s1", "ax"], ["p"]), N("Slice", ["a0", "s1", "s2", "ax"], ["q"])]
        cut = {"s0": i64(0), "s1": i64(h), "s2": i64(c), "ax": i64(1)}
    else:
        nodes += [N("Split", ["a0", "sp"], ["p", "q"], axis=1)]
        cut = {"sp": i64(h, h)}
    nodes += [
        N("Conv", ["q", "wb1", "bb1"], ["r1"], pads=[1, 1, 1, 1]),
        N("Relu", ["r1"], ["r1r"]),
        N("Conv", ["r1r", "wb2", "bb2"], ["r2"], pads=[1, 1, 1, 1]),
        N("Add", ["r2", "q"], ["r"]),
        N("Concat", ["p", "q", "r"], ["cat"], axis=1),
        N("Conv", ["cat", "wo", "bo"], ["y"]),
    ]
    inits = {
        "w0": W(c, 16, 1, 1, seed=1),
        "b0": W(c, seed=2),
        "wb1": W(h, h, 3, 3, seed=3),
        "bb1": W(h, seed=4),
        "wb2": W(h, h, 3, 3, seed=5),
        "bb2": W(h, seed=6),
        "wo": W(c, 3 * h, 1, 1, seed=7),
        "bo": W(c, seed=8),
        **cut,
    }
    return _model(nodes, rand(1, 16, 16, 16), inits, opset=18)


def shuffle(c, g):
    """ShuffleNet's unit: grouped 1x1 conv -> ReLU -> channel shuffle (Reshape-Transpose-Reshape) ->
    depthwise 3x3 -> grouped 1x1 conv."""
    nodes = [
        N("Conv", ["x", "w0", "b0"], ["a"], group=g),
        N("Relu", ["a"], ["ar"]),
        N("Reshape", ["ar", "s5"], ["r5"]),
        N("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        N("Reshape", ["t5", "s4"], ["sh"]),
        N("Conv", ["sh", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1]),
        N("Conv", ["d", "w1", "b1"], ["y"], group=g),
    ]
    inits = {
        "w0": W(c, c // g, 1, 1, seed=1),
        "b0": W(c, seed=2),
        "s5": i64(1, g, c // g, 14, 14),
        "s4": i64(1, c, 14, 14),
        "wd": W(c, 1, 3, 3, seed=3),
        "bd": W(c, seed=4),
        "w1": W(c, c // g, 1, 1, seed=5),
        "b1": W(c, seed=6),
    }
    return _model(nodes, rand(1, c, 14, 14), inits)


def regnet(c, stride=1):
    """RegNetY's bottleneck without its SE: 1x1 conv -> grouped 3x3 conv of 8 channels a group -> 1x1 conv."""
    nodes = [
        N("Conv", ["x", "w0"], ["a"]),
        N("Relu", ["a"], ["ar"]),
        N("Conv", ["ar", "wg"], ["g"], group=c // 8, pads=[1, 1, 1, 1], strides=[stride, stride]),
        N("Relu", ["g"], ["gr"]),
        N("Conv", ["gr", "w1"], ["y"]),
    ]
    inits = {"w0": W(c, 16, 1, 1, seed=1), "wg": W(c, 8, 3, 3, seed=2), "w1": W(c, c, 1, 1, seed=3)}
    return _model(nodes, rand(1, 16, 14, 14), inits)


def conv1d(c, transpose_in=False):
    """Two Conv1d over a [1, C, 50] sequence (or a [1, 50, C] one transposed first)."""
    nodes = [N("Transpose", ["x"], ["xt"], perm=[0, 2, 1])] if transpose_in else []
    nodes += [
        N("Conv", ["xt" if transpose_in else "x", "w0", "b0"], ["a"], pads=[1, 1]),
        N("Relu", ["a"], ["ar"]),
        N("Conv", ["ar", "w1", "b1"], ["y"], pads=[2, 2], kernel_shape=[5]),
    ]
    inits = {"w0": W(64, c, 3, seed=1), "b0": W(64, seed=2), "w1": W(32, 64, 5, seed=3), "b1": W(32, seed=4)}
    return _model(nodes, rand(1, 50, c) if transpose_in else rand(1, c, 50), inits)


def nhwc(c, cin):
    """An NHWC input transposed in front of the first conv, and the output transposed back."""
    nodes = [
        N("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
        N("Conv", ["xt", "w0", "b0"], ["a"], pads=[1, 1, 1, 1]),
        N("Relu", ["a"], ["ar"]),
        N("Conv", ["ar", "w1", "b1"], ["b"], pads=[1, 1, 1, 1], strides=[2, 2]),
        N("Transpose", ["b"], ["y"], perm=[0, 2, 3, 1]),
    ]
    inits = {"w0": W(c, cin, 3, 3, seed=1), "b0": W(c, seed=2), "w1": W(2 * c, c, 3, 3, seed=3), "b1": W(2 * c, seed=4)}
    return _model(nodes, rand(1, 16, 16, cin), inits)


def convnext(c, ln_axis1=False):
    """ConvNeXt after a stage: 2x2 downsampling conv (16 -> C) -> depthwise 7x7 -> Permute to NHWC ->
    LayerNorm(last axis) -> Linear -> ReLU -> Linear -> Permute back -> + residual -> (a channels-first
    LayerNorm written out over axis 1: ReduceMean/Sub/Pow/Sqrt/Div) -> 2x2 downsampling conv -> the
    head: global pool -> LayerNorm over the [C, 1, 1] axes -> Flatten."""
    nodes = [
        N("Conv", ["x", "ws", "bs"], ["s"], strides=[2, 2], kernel_shape=[2, 2]),
        N("Conv", ["s", "wd", "bd"], ["d"], group=c, pads=[3, 3, 3, 3]),
        N("Transpose", ["d"], ["dt"], perm=[0, 2, 3, 1]),
        N("LayerNormalization", ["dt", "g", "be"], ["ln"], axis=-1, epsilon=1e-6),
        N("MatMul", ["ln", "m1"], ["h1"]),
        N("Add", ["h1", "mb1"], ["h1b"]),
        N("Relu", ["h1b"], ["h1r"]),
        N("MatMul", ["h1r", "m2"], ["h2"]),
        N("Add", ["h2", "mb2"], ["h2b"]),
        N("Transpose", ["h2b"], ["h2t"], perm=[0, 3, 1, 2]),
        N("Add", ["s", "h2t"], ["r"]),
    ]
    inits = {
        "ws": W(c, 16, 2, 2, seed=1),
        "bs": W(c, seed=2),
        "wd": W(c, 1, 7, 7, seed=3),
        "bd": W(c, seed=4),
        "g": 1 + W(c, seed=5),
        "be": W(c, seed=6),
        "m1": W(c, 4 * c, seed=7),
        "mb1": W(4 * c, seed=8),
        "m2": W(4 * c, c, seed=9),
        "mb2": W(c, seed=10),
        "wo": W(2 * c, c, 2, 2, seed=11),
        "bo": W(2 * c, seed=12),
    }
    if ln_axis1:
        nodes += [
            N("ReduceMean", ["r"], ["mu"], axes=[1], keepdims=1),
            N("Sub", ["r", "mu"], ["xc"]),
            N("Pow", ["xc", "two"], ["sq"]),
            N("ReduceMean", ["sq"], ["var"], axes=[1], keepdims=1),
            N("Add", ["var", "eps"], ["ve"]),
            N("Sqrt", ["ve"], ["sd"]),
            N("Div", ["xc", "sd"], ["nx"]),
            N("Mul", ["nx", "g2"], ["nxg"]),
            N("Add", ["nxg", "b2"], ["rn"]),
        ]
        inits.update({"two": f32(2), "eps": f32(1e-6), "g2": 1 + W(1, c, 1, 1, seed=13), "b2": W(1, c, 1, 1, seed=14)})
    else:
        nodes += [N("Identity", ["r"], ["rn"])]
    nodes += [
        N("Conv", ["rn", "wo", "bo"], ["o"], strides=[2, 2], kernel_shape=[2, 2]),
        N("GlobalAveragePool", ["o"], ["gp"]),
        N("LayerNormalization", ["gp", "gh", "bh"], ["hn"], axis=1),
        N("Flatten", ["hn"], ["y"]),
    ]
    inits.update({"gh": 1 + W(2 * c, 1, 1, seed=15), "bh": W(2 * c, 1, 1, seed=16)})
    return _model(nodes, rand(1, 16, 32, 32), inits)


def swin(c):
    """Swin: 2x2 patch embedding conv -> flatten/transpose to tokens -> LayerNorm -> [1, 8, 8, C] ->
    roll by 2 (Slice + Concat on both axes) -> window partition (Reshape/Transpose to 4 windows of 16)
    -> attention -> window reverse -> back to [1, C, 8, 8] -> + embedding -> 2x2 conv -> global pool ->
    Squeeze(-1, -2) (the dynamo exporter's negative axes)."""
    nodes = [
        N("Conv", ["x", "ws", "bs"], ["s"], strides=[2, 2], kernel_shape=[2, 2]),
        N("Reshape", ["s", "sh3"], ["f"]),
        N("Transpose", ["f"], ["ft"], perm=[0, 2, 1]),
        N("LayerNormalization", ["ft", "g", "be"], ["ln"], axis=-1),
        N("Reshape", ["ln", "sh4"], ["g4"]),
        N("Slice", ["g4", "k2", "k8", "ax1"], ["ra"]),
        N("Slice", ["g4", "k0", "k2", "ax1"], ["rb"]),
        N("Concat", ["ra", "rb"], ["roll0"], axis=1),
        N("Slice", ["roll0", "k2", "k8", "ax2"], ["rc"]),
        N("Slice", ["roll0", "k0", "k2", "ax2"], ["rd"]),
        N("Concat", ["rc", "rd"], ["roll1"], axis=2),
        N("Reshape", ["roll1", "sh6"], ["w6"]),
        N("Transpose", ["w6"], ["w6t"], perm=[0, 1, 3, 2, 4, 5]),
        N("Reshape", ["w6t", "shw"], ["win"]),
        N("MatMul", ["win", "wq"], ["q"]),
        N("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
        N("MatMul", ["q", "qt"], ["att"]),
        N("Softmax", ["att"], ["att_s"], axis=-1),
        N("MatMul", ["att_s", "win"], ["o"]),
        N("Reshape", ["o", "sh6b"], ["o6"]),
        N("Transpose", ["o6"], ["o6t"], perm=[0, 1, 3, 2, 4, 5]),
        N("Reshape", ["o6t", "sh4"], ["o4"]),
        N("Transpose", ["o4"], ["o4t"], perm=[0, 3, 1, 2]),
        N("Add", ["o4t", "s"], ["r"]),
        N("Conv", ["r", "wo", "bo"], ["o2"], strides=[2, 2], kernel_shape=[2, 2]),
        N("GlobalAveragePool", ["o2"], ["gp"]),
        N("Squeeze", ["gp", "axsq"], ["y"]),
    ]
    inits = {
        "ws": W(c, 3, 2, 2, seed=1),
        "bs": W(c, seed=2),
        "sh3": i64(1, c, 64),
        "g": 1 + W(c, seed=5),
        "be": W(c, seed=6),
        "sh4": i64(1, 8, 8, c),
        "k0": i64(0),
        "k2": i64(2),
        "k8": i64(8),
        "ax1": i64(1),
        "ax2": i64(2),
        "sh6": i64(1, 2, 4, 2, 4, c),
        "shw": i64(4, 16, c),
        "wq": W(c, c, seed=7),
        "sh6b": i64(1, 2, 2, 4, 4, c),
        "wo": W(2 * c, c, 2, 2, seed=11),
        "bo": W(2 * c, seed=12),
        "axsq": i64(-1, -2),
    }
    return _model(nodes, rand(1, 3, 16, 16), inits)


def after_conv(tail, inits, c=32):
    """A 1x1 conv 16 -> c (blocked), then `tail`: one op TVM's ConvertLayout mis-converted on it."""
    nodes = [N("Conv", ["x", "w0", "b0"], ["a"])] + tail
    return _model(nodes, rand(1, 16, 8, 8), {"w0": W(c, 16, 1, 1, seed=1), "b0": W(c, seed=2), **inits})


GUARDED = {  # name -> (tail, inits, conv layouts on TARGET): guarded ops, and slices PropagateBlockedLayout moves
    "layernorm_axis1": (
        [N("LayerNormalization", ["a", "g", "b"], ["y"], axis=1)],
        {"g": 1 + W(32, 8, 8), "b": W(32, 8, 8)},
        {"NCHW16c": 1},
    ),
    "mean_c_keepdims": (
        [N("ReduceMean", ["a"], ["m"], axes=[1], keepdims=1), N("Sub", ["a", "m"], ["y"])],
        {},
        {"NCHW16c": 1},
    ),
    "sum_c_to_conv": (
        [N("ReduceSum", ["a", "ax"], ["m"], keepdims=1), N("Conv", ["m", "w1"], ["y"])],
        {"ax": i64(1), "w1": W(16, 1, 1, 1)},
        {"NCHW16c": 1, "NCHW1c": 1},
    ),
    "spatial_mask": (
        [N("Conv", ["a", "wm"], ["m"]), N("Sigmoid", ["m"], ["ms"]), N("Mul", ["a", "ms"], ["y"])],
        {"wm": W(1, 32, 1, 1)},
        {"NCHW16c": 1, "NCHW": 1},
    ),  # the 1-channel mask conv
    "scalar_4d_const": ([N("Add", ["a", "v"], ["y"])], {"v": W(1, 1, 1, 1)}, {"NCHW16c": 1}),
    "split_unequal": (
        [N("Split", ["a", "sp"], ["p", "q"], axis=1), N("Conv", ["q", "w1"], ["y"])],
        {"sp": i64(8, 24), "w1": W(16, 24, 1, 1)},
        {"NCHW16c": 1, "NCHW8c": 1},
    ),
    "split_three": (
        [N("Split", ["a", "sp"], ["p", "q", "r"], axis=1), N("Concat", ["r", "p", "q"], ["y"], axis=1)],
        {"sp": i64(16, 8, 8)},
        {"NCHW16c": 1},
    ),
    "convtranspose_grouped": (
        [N("ConvTranspose", ["a", "wt"], ["y"], strides=[2, 2], kernel_shape=[2, 2], group=2)],
        {"wt": W(32, 8, 2, 2)},
        {"NCHW16c": 1},
    ),
    "grouped_16_groups": (
        [N("Conv", ["a", "wg"], ["y"], group=16, pads=[1, 1, 1, 1])],  # BlockGroupedConv
        {"wg": W(256, 16, 3, 3)},
        {"NCHW16c": 2},
    ),
    "squeeze_negative": (
        [N("GlobalAveragePool", ["a"], ["g"]), N("Squeeze", ["g", "ax"], ["y"])],
        {"ax": i64(-1, -2)},
        {"NCHW16c": 1},
    ),
    "slice_blocks_concat_h": (
        [
            N("Slice", ["a", "sb0", "se0", "sa0"], ["p"]),  # whole blocks of channels; H from -3
            N("Slice", ["a", "sb1", "se1", "sa1"], ["q"]),
            N("Concat", ["p", "q"], ["y"], axis=2),
        ],
        {
            "sb0": i64(16, 5),
            "se0": i64(32, 8),
            "sa0": i64(1, 2),
            "sb1": i64(-3, 16),
            "se1": i64(100, 32),
            "sa1": i64(2, 1),
        },
        {"NCHW16c": 1},
    ),
    "slice_part_of_block": (
        [N("Slice", ["a", "sb0", "se0", "sa0"], ["y"])],
        {"sb0": i64(8), "se0": i64(24), "sa0": i64(1)},
        {"NCHW16c": 1},
    ),
    "compare_where": (
        [N("Greater", ["a", "z"], ["m"]), N("Where", ["m", "a", "z"], ["y"])],
        {"z": f32(0)},
        {"NCHW16c": 1},
    ),
}

PATTERNS = {  # name -> (model builder, conv layouts on TARGET after Kiln's graph passes)
    "fpn_16": (lambda: fpn(16), {"NCHW1c": 1, "NCHW16c": 5}),  # the ConvTranspose is a conv (ConvTransposeAsConv)
    "fpn_24": (lambda: fpn(24), {"NCHW1c": 1, "NCHW16c": 3, "NCHW8c": 2}),
    "fpn_40": (lambda: fpn(40), {"NCHW1c": 1, "NCHW16c": 3, "NCHW8c": 2}),
    "c2f_32": (lambda: c2f(32), {"NCHW16c": 4}),
    "c2f_48": (lambda: c2f(48), {"NCHW16c": 1, "NCHW8c": 3}),
    "c2f_80": (lambda: c2f(80), {"NCHW16c": 1, "NCHW8c": 3}),
    "c2f_slice": (lambda: c2f(32, use_slice=True), {"NCHW16c": 4}),
    # the grouped convs blocked (BlockGroupedConv), the shuffle too where 16-channel blocks hold whole groups of it
    # (PropagateBlockedLayout); 3 groups of 16 do not divide a block: the depthwise conv after it reads NCHW
    "shuffle_32_g2": (lambda: shuffle(32, 2), {"NCHW16c": 3}),
    "shuffle_64_g4": (lambda: shuffle(64, 4), {"NCHW16c": 3}),
    "shuffle_48_g3": (lambda: shuffle(48, 3), {"NCHW16c": 2, "NCHW": 1}),
    "shuffle_24_g2": (lambda: shuffle(24, 2), {"NCHW": 3}),  # 12 channels a group: no block divides them
    "regnet_48": (lambda: regnet(48), {"NCHW16c": 3}),  # 8 a group in 16-channel blocks: 2 groups merged a block
    "regnet_48_s2": (lambda: regnet(48, stride=2), {"NCHW16c": 3}),
    "regnet_104": (lambda: regnet(104), {"NCHW16c": 1, "NCHW8c": 2}),  # 104 channels: blocks of 8, one a group
    "conv1d_32": (lambda: conv1d(32), {"NCHW16c": 2}),  # Conv1dAsConv2d: height-1 conv2d, blocked
    "conv1d_24": (lambda: conv1d(24), {"NCHW8c": 1, "NCHW16c": 1}),  # 24 input channels: blocked by 8
    "conv1d_transposed": (lambda: conv1d(32, transpose_in=True), {"NCHW16c": 2}),
    "nhwc_3": (lambda: nhwc(16, 3), {"NCHW1c": 1, "NCHW16c": 1}),
    "nhwc_1": (lambda: nhwc(16, 1), {"NCHW1c": 1, "NCHW16c": 1}),
    "nhwc_24_40": (lambda: nhwc(40, 24), {"NCHW8c": 2}),
    "convnext_32": (lambda: convnext(32), {"NCHW16c": 3}),  # the depthwise conv too (PropagateBlockedLayout)
    "convnext_32_ln_axis1": (lambda: convnext(32, ln_axis1=True), {"NCHW16c": 3}),
    "convnext_24_ln_axis1": (lambda: convnext(24, ln_axis1=True), {"NCHW16c": 1, "NCHW8c": 2}),
    "swin_32": (lambda: swin(32), {"NCHW1c": 1, "NCHW16c": 1}),
    "swin_24": (lambda: swin(24), {"NCHW1c": 1, "NCHW8c": 1}),
    **{
        f"op_{k}": (lambda t=t, i=i, c=(256 if k == "grouped_16_groups" else 32): after_conv(t, i, c), layouts)
        for k, (t, i, layouts) in GUARDED.items()
    },
}


def _graph_passes(model):
    """The module after Kiln's graph passes for TARGET (what the report's conv_layouts counts)."""
    co = CompileOptions.make(target=TARGET)
    mod = import_onnx(model, {}).mod
    with co.target.tvm(), tvm.transform.PassContext(opt_level=3):
        for spec in co.backend.pipeline(2, co.disabled_passes):
            if not spec.graph:
                break
            p = spec.make(co)
            if p is not None:  # rows that only run when asked (Quantize, MixedPrecision)
                mod = p(mod)
    return mod


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pattern_keeps_convs_blocked(name):
    build, layouts = PATTERNS[name]
    assert analysis.conv_layouts(_graph_passes(build()[0])) == layouts


END_TO_END = {
    "c2f_32": 2,
    "c2f_slice": 2,
    "regnet_48": 2,
    "regnet_48_s2": 2,
    "regnet_104": 2,
    "shuffle_32_g2": 3,
    "shuffle_64_g4": 3,
}


@pytest.mark.parametrize("name", list(END_TO_END))
def test_runs_blocked_end_to_end(name):
    """C2f's split (by sections) and slices (whole blocks, PropagateBlockedLayout) stay blocked, and so do
    grouped convs (BlockGroupedConv) and a channel shuffle: the only transforms are into the block at the input
    and out of it at the output, and the shuffle's own transpose (now of the blocked tensor)."""
    assert count_layout_transforms(_graph_passes(PATTERNS[name][0]()[0])) == END_TO_END[name]


def test_layernorm_over_chw_matches_onnxruntime_in_nhwc(tmp_path):
    """--layout NHWC permutes a LayerNorm's axes but not its [C, H, W] gamma: it reads NCHW there too."""
    model, feeds = PATTERNS["op_layernorm_axis1"][0]()
    check_against_ort(model, feeds, tmp_path, layout="NHWC")


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pattern_matches_onnxruntime(tmp_path, name):
    """Default options on the host, no pass skipped (a compile fallback would hide a broken pass),
    and as many convs left in NCHW as on TARGET."""
    build, layouts = PATTERNS[name]
    model, feeds = build()
    res = kiln.compile(model, tmp_path / "m.kiln")
    assert res.report["layout"] == "NCHWc" and not res.report.get("passes_skipped")
    assert res.report["conv_layouts"].get("NCHW", 0) == layouts.get("NCHW", 0)
    ours = kiln.load(tmp_path / "m.kiln").run(feeds)
    for out, ref in zip(model.graph.output, ort_run(model, feeds)):
        assert ours[out.name].shape == ref.shape
        np.testing.assert_allclose(ours[out.name], ref, rtol=1e-4, atol=1e-4, err_msg=out.name)
