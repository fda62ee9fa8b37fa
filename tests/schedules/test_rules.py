"""Each default-schedule rule on an example workload: the registry picks the expected rule, the
rule applies, and the scheduled kernel matches numpy."""

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from kiln.compiler.legalize import LEGALIZE
from kiln.schedules.rules import rules
from kiln.schedules.rules.pointwise import pointwise_rows
from kiln.schedules.rules.registry import RULES, classify

TARGET = tvm.target.Target({"kind": "llvm"})


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _kernel(build_body, params):
    """Relax function -> its single fused PrimFunc (what the schedules see in a real build)."""
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build_body(bb))
        bb.emit_func_output(out)
    with TARGET:
        mod = tvm.transform.Sequential(
            [
                relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE),
                relax.transform.AnnotateTIROpPattern(),
                relax.transform.FuseOps(),
                relax.transform.FuseTIR(),
            ]
        )(bb.get())
    funcs = [f for _, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert len(funcs) == 1, "the workload should fuse into one kernel"
    return funcs[0]


def _run(func, inputs):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET)
    out_ty = func.params[-1].ty
    out = tvm.runtime.tensor(np.zeros([int(d) for d in out_ty.shape], str(out_ty.dtype)))
    lib["main"](*[tvm.runtime.tensor(x) for x in inputs], out)
    return out.numpy()


def _var(name, shape):
    return relax.Var(name, relax.TensorType(shape, "float32"))


def _conv_nchw_ref(x, w, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1), np.float64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i : i + out.shape[2], j : j + out.shape[3]], w[:, :, i, j])
    return out


def _workloads():
    x, w, b = rnd(1, 16, 9, 9), rnd(32, 16, 3, 3, seed=1), rnd(1, 32, 1, 1, seed=2)
    conv = lambda bb: relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(cx, cw, padding=[1, 1])), cb)))
    cx, cw, cb = _var("x", (1, 16, 9, 9)), _var("w", (32, 16, 3, 3)), _var("b", (1, 32, 1, 1))
    yield (
        "conv2d_nchw",
        "conv2d_nchw:conv2d_nchw_oc",
        conv,
        [cx, cw, cb],
        [x, w, b],
        np.maximum(_conv_nchw_ref(x, w, 1) + b, 0),
    )

    # a stem: 3 input channels, stride 2, padding (the padded rows in a stack tile)
    sx, sw = rnd(1, 3, 15, 17, seed=11), rnd(16, 3, 3, 3, seed=12)
    vsx, vsw = _var("x", (1, 3, 15, 17)), _var("w", (16, 3, 3, 3))
    yield (
        "conv2d_stem",
        "conv2d_nchw:conv2d_nchw_oc",
        lambda bb: relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(vsx, vsw, strides=[2, 2], padding=[1, 1]))),
        [vsx, vsw],
        [sx, sw],
        np.maximum(_conv_nchw_ref(sx, sw, 1)[:, :, ::2, ::2], 0),
    )

    # 1x1 conv with channels that cannot be blocked by 16 (MobileNetV2's 24), bias, clip: the pointwise rule
    x1, w1, b1 = rnd(1, 24, 8, 14), rnd(48, 24, 1, 1, seed=4), rnd(1, 48, 1, 1, seed=5)
    px, pw, pb = _var("x", (1, 24, 8, 14)), _var("w", (48, 24, 1, 1)), _var("b", (1, 48, 1, 1))
    pointwise = lambda bb: relax.op.clip(bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(px, pw)), pb)), 0.0, 6.0)
    yield (
        "conv2d_1x1_nchw",
        "conv2d_nchw",
        pointwise,
        [px, pw, pb],
        [x1, w1, b1],
        np.clip(_conv_nchw_ref(x1, w1, 0) + b1, 0, 6),
    )

    # depthwise NCHW (channels that cannot be blocked): padding stride 1, padding stride 2 (the
    # de-interleaved padded plane), no padding; odd widths, bias + clip epilogue
    for tag, hw, stride, pad in (("s1", (10, 13), 1, 1), ("s2", (11, 14), 2, 1), ("nopad", (9, 12), 1, 0)):
        dx, dw, db = rnd(1, 24, *hw, seed=6), rnd(24, 1, 3, 3, seed=7), rnd(1, 24, 1, 1, seed=8)
        vdx, vdw, vdb = _var("x", (1, 24, *hw)), _var("w", (24, 1, 3, 3)), _var("b", (1, 24, 1, 1))
        dwc = lambda bb, vdx=vdx, vdw=vdw, vdb=vdb, stride=stride, pad=pad: relax.op.clip(
            bb.emit(
                relax.op.add(
                    bb.emit(relax.op.nn.conv2d(vdx, vdw, strides=[stride, stride], padding=[pad, pad], groups=24)),
                    vdb,
                )
            ),
            0.0,
            6.0,
        )
        ref = np.stack([_conv_nchw_ref(dx[:, c : c + 1], dw[c : c + 1], pad)[:, 0] for c in range(24)], axis=1)[
            :, :, ::stride, ::stride
        ]
        yield f"depthwise_nchw_{tag}", "depthwise_nchw", dwc, [vdx, vdw, vdb], [dx, dw, db], np.clip(ref + db, 0, 6)

    # NCHW <-> NCHW16c transforms: transposed tiles (widths 24 and 8 -> tiles of 8 pixels)
    lx = rnd(1, 32, 3, 24, seed=9)
    vlx = _var("x", (1, 32, 3, 24))
    yield (
        "layout_block",
        "layout_transform",
        lambda bb: relax.op.layout_transform(vlx, index_map=lambda n, c, h, w: (n, c // 16, h, w, c % 16)),
        [vlx],
        [lx],
        lx.reshape(1, 2, 16, 3, 24).transpose(0, 1, 3, 4, 2),
    )
    ux = rnd(1, 2, 5, 8, 16, seed=10)
    vux = _var("x", (1, 2, 5, 8, 16))
    yield (
        "layout_unblock",
        "layout_transform",
        lambda bb: relax.op.layout_transform(vux, index_map=lambda n, c, h, w, b: (n, c * 16 + b, h, w)),
        [vux],
        [ux],
        ux.transpose(0, 1, 4, 2, 3).reshape(1, 32, 5, 8),
    )

    xc = x.reshape(1, 1, 16, 9, 9).transpose(0, 1, 3, 4, 2)  # NCHW16c
    wc = w.reshape(2, 16, 1, 16, 3, 3).transpose(0, 2, 4, 5, 3, 1)  # OIHW16i16o
    ref = _conv_nchw_ref(x, w, 1).reshape(1, 2, 16, 9, 9).transpose(0, 1, 3, 4, 2)
    vx, vw = _var("x", (1, 1, 9, 9, 16)), _var("w", (2, 1, 3, 3, 16, 16))
    yield (
        "conv2d_nchwc",
        "conv2d",
        lambda bb: relax.op.nn.conv2d(vx, vw, padding=[1, 1], data_layout="NCHW16c", kernel_layout="OIHW16i16o"),
        [vx, vw],
        [xc, wc],
        ref,
    )

    # 32 input channels in two blocks, stride 2: the reduction runs (ic / 16, kh, kw, ic % 16),
    # the weights' memory order
    x2, w2 = rnd(1, 32, 9, 9, seed=14), rnd(16, 32, 3, 3, seed=15)
    ref2 = _conv_nchw_ref(x2, w2, 1)[:, :, ::2, ::2].reshape(1, 1, 16, 5, 5).transpose(0, 1, 3, 4, 2)
    vx2, vw2 = _var("x", (1, 2, 9, 9, 16)), _var("w", (1, 2, 3, 3, 16, 16))
    yield (
        "conv2d_nchwc_2blocks_s2",
        "conv2d",
        lambda bb: relax.op.nn.conv2d(
            vx2, vw2, strides=[2, 2], padding=[1, 1], data_layout="NCHW16c", kernel_layout="OIHW16i16o"
        ),
        [vx2, vw2],
        [
            x2.reshape(1, 2, 16, 9, 9).transpose(0, 1, 3, 4, 2),
            w2.reshape(1, 16, 2, 16, 3, 3).transpose(0, 2, 4, 5, 3, 1),
        ],
        ref2,
    )

    a, m = rnd(4, 48), rnd(48, 32, seed=3)
    va, vm = _var("a", (4, 48)), _var("m", (48, 32))
    yield "matmul", "matmul", lambda bb: relax.op.matmul(va, vm), [va, vm], [a, m], a.astype(np.float64) @ m

    # 96 rows x 5 column vectors with a bias and ReLU epilogue: the 2-D register tile (schedules/rules/matmul.py)
    a2, m2, b2 = rnd(2, 96, 64, seed=4), rnd(64, 80, seed=5), rnd(80, seed=6)
    va2, vm2, vb2 = _var("a", (2, 96, 64)), _var("m", (64, 80)), _var("b", (80,))
    yield (
        "matmul_rows_bias_relu",
        "matmul",
        lambda bb: relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.matmul(va2, vm2)), vb2))),
        [va2, vm2, vb2],
        [a2, m2, b2],
        np.maximum(a2.astype(np.float64) @ m2 + b2, 0),
    )
    # layer norm over 64 (4 lanes-wide partial sums per row) and over 40 (not a multiple: scalar sums)
    for width in (64, 40):
        ln, g, be = rnd(2, 12, width, seed=7), rnd(width, seed=8), rnd(width, seed=9)
        vln, vg, vbe = _var("x", (2, 12, width)), _var("g", (width,)), _var("be", (width,))
        mu, var = ln.mean(-1, keepdims=True), ln.var(-1, keepdims=True)
        yield (
            f"layer_norm_{width}",
            "multi_reduction",
            lambda bb, vln=vln, vg=vg, vbe=vbe: relax.op.nn.layer_norm(vln, vg, vbe, axes=[-1]),
            [vln, vg, vbe],
            [ln, g, be],
            (ln - mu) / np.sqrt(var + 1e-5) * g + be,
        )
    w64 = rnd(6, 64, seed=10) * 4
    vw64 = _var("s", (6, 64))
    e64 = np.exp(w64 - w64.max(-1, keepdims=True))
    yield (
        "softmax_64",
        "softmax",
        lambda bb: relax.op.nn.softmax(vw64, axis=-1),
        [vw64],
        [w64],
        e64 / e64.sum(-1, keepdims=True),
    )

    p = rnd(1, 8, 12, 12)
    vp = _var("p", (1, 8, 12, 12))
    yield (
        "max_pool",
        "pool",
        lambda bb: relax.op.nn.max_pool2d(vp, pool_size=[2, 2], strides=[2, 2]),
        [vp],
        [p],
        p.reshape(1, 8, 6, 2, 6, 2).max(axis=(3, 5)),
    )
    yield "mean", "reduction", lambda bb: relax.op.mean(vp, axis=[2, 3]), [vp], [p], p.mean(axis=(2, 3))
    # ResNet's stem pool: 3x3, stride 2, padding 1 (strided lanes: unrolled scalars); 13 wide -> 7 outputs
    q = rnd(1, 8, 13, 13, seed=13)
    vq = _var("q", (1, 8, 13, 13))
    qp = np.pad(q, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=-np.inf)
    yield (
        "max_pool_3x3s2",
        "pool",
        lambda bb: relax.op.nn.max_pool2d(vq, pool_size=[3, 3], strides=[2, 2], padding=[1, 1]),
        [vq],
        [q],
        np.max([qp[:, :, i : i + 13 : 2, j : j + 13 : 2] for i in range(3) for j in range(3)], axis=0),
    )

    s = rnd(6, 40)
    vs = _var("s", (6, 40))
    e = np.exp(s - s.max(-1, keepdims=True))
    yield "softmax", "softmax", lambda bb: relax.op.nn.softmax(vs, axis=-1), [vs], [s], e / e.sum(-1, keepdims=True)
    yield (
        "softmax_axis1",
        "softmax:multi_reduction",
        lambda bb: relax.op.nn.softmax(vs, axis=0),
        [vs],
        [s],
        np.exp(s - s.max(0)) / np.exp(s - s.max(0)).sum(0),
    )

    # a mean to one value: its divide reads a 0-D sum and has no loop, which TVM's rfactor tripped on
    # ("Check failed: block_realize"); the kernel was left unscheduled
    b = rnd(1, 2, 8, 8, 16)
    vb = _var("b", (1, 2, 8, 8, 16))
    yield "mean_to_one_value", "reduction", lambda bb: relax.op.mean(vb), [vb], [b], np.array(b.mean(), "float32")

    t = rnd(2, 3, 32)
    vt = _var("t", (2, 3, 32))
    yield (
        "transpose_relu",
        "injective",
        lambda bb: relax.op.nn.relu(bb.emit(relax.op.permute_dims(vt, [1, 0, 2]))),
        [vt],
        [t],
        np.maximum(t.transpose(1, 0, 2), 0),
    )


@pytest.mark.parametrize("case", list(_workloads()), ids=lambda c: c[0])
def test_rule_on_workload(case):
    name, kind, body, params, inputs, ref = case
    kind, _, rule = kind.partition(
        ":"
    )  # the kind the registry picks, and the rule under test (default: the kind's own)
    func = _kernel(body, params)
    sch = s_tir.Schedule(func)
    got_kind, anchor = classify(sch)
    assert got_kind == kind
    RULES[("cpu", rule or kind)](sch, anchor, 16)
    scheduled = sch.mod["main"]
    assert not tvm_ffi.structural_equal(scheduled, func)  # the rule did something
    np.testing.assert_allclose(_run(scheduled, inputs), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_run(scheduled, inputs), _run(func, inputs), rtol=1e-5, atol=1e-5)


def test_fallback_when_a_rule_does_not_fit():
    """An NCHW conv with 12 output channels cannot vectorize over channels by 16: the pass falls
    back to the generic tiled rule, and the kernel still matches numpy."""
    from kiln.schedules.rules.apply import ApplyDefaultSchedules

    x, w = rnd(1, 4, 10, 10), rnd(12, 4, 3, 3, seed=1)
    vx, vw = _var("x", (1, 4, 10, 10)), _var("w", (12, 4, 3, 3))
    func = _kernel(lambda bb: relax.op.nn.conv2d(vx, vw, strides=[2, 2]), [vx, vw])
    p = ApplyDefaultSchedules(TARGET, 16)
    mod = p(tvm.IRModule({"k": func}))
    assert p.stats == {"kernels_scheduled": 1, "kernels_unscheduled": 0} and p.by_kind == {"conv2d_nchw": 1}
    ref = _conv_nchw_ref(x, w, 0)[:, :, ::2, ::2]
    np.testing.assert_allclose(_run(mod["k"], [x, w]), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "channels,groups,out,hw,stride",
    [(8, 4, 8, (7, 9), 1), (32, 4, 32, (14, 14), 1), (48, 6, 48, (15, 14), 2), (24, 3, 48, (7, 7), 1)],
    ids=["2_per_group", "regnet_8_per_group", "stride_2", "2_outputs_per_input"],
)
def test_grouped_conv_takes_the_depthwise_rule_with_a_channel_tile(channels, groups, out, hw, stride):
    """A grouped NCHW conv with a few input channels per group (RegNet's 8: it ran at 2-5% of peak on
    the generic reduction rule, 1.95x onnxruntime) takes the depthwise rule, with several output
    channels of a group in the register tile; numerics against numpy."""
    from kiln.schedules.rules.apply import ApplyDefaultSchedules

    gw, per = channels // groups, out // groups
    x, w = rnd(1, channels, *hw), rnd(out, gw, 3, 3, seed=1)
    vx, vw = _var("x", (1, channels, *hw)), _var("w", (out, gw, 3, 3))
    conv = lambda bb: relax.op.nn.conv2d(vx, vw, strides=[stride, stride], padding=[1, 1], groups=groups)
    func = _kernel(conv, [vx, vw])
    p = ApplyDefaultSchedules(TARGET, 16)
    mod = p(tvm.IRModule({"k": func}))
    assert p.stats == {"kernels_scheduled": 1, "kernels_unscheduled": 0} and p.by_kind == {"depthwise_nchw": 1}
    sch = s_tir.Schedule(func)
    RULES[("cpu", "depthwise_nchw")](sch, classify(sch)[1], 16)  # the rule itself takes it (no ScheduleError)
    parts = [_conv_nchw_ref(x[:, gw * g : gw * (g + 1)], w[per * g : per * (g + 1)], 1) for g in range(groups)]
    ref = np.concatenate(parts, axis=1)[:, :, ::stride, ::stride]
    np.testing.assert_allclose(_run(mod["k"], [x, w]), ref, rtol=1e-4, atol=1e-4)


def test_a_wide_grouped_conv_is_left_to_the_reduction_rule():
    """More input channels per group than MAX_GROUP_WIDTH: the depthwise rule refuses it."""
    from kiln.schedules.rules.depthwise import MAX_GROUP_WIDTH

    c = 2 * (MAX_GROUP_WIDTH + 8)
    vx, vw = _var("x", (1, c, 5, 5)), _var("w", (c, c // 2, 3, 3))
    sch = s_tir.Schedule(_kernel(lambda bb: relax.op.nn.conv2d(vx, vw, padding=[1, 1], groups=2), [vx, vw]))
    with pytest.raises(s_tir.ScheduleError, match="grouped"):
        RULES[("cpu", "depthwise_nchw")](sch, classify(sch)[1], 16)


def test_pointwise_rule_keeps_the_output_layout_without_an_epilogue(tmp_path):
    """A bias-free 24-channel 1x1 conv whose result is the kernel's output: the pointwise rule must
    not flatten the output buffer (it did, and the artifact's own code rejected its inputs)."""
    from helpers import make_model, ort_run, rand
    from onnx import helper

    import kiln

    m = make_model(
        [helper.make_node("Conv", ["input", "w"], ["output"])],
        {"input": rand(1, 24, 8, 8)},
        ["output"],
        {"w": rand(32, 24, 1, 1, seed=2)},
    )
    kiln.compile(m, tmp_path / "pw.kiln", layout="NCHW")
    x = rand(1, 24, 8, 8, seed=4)
    np.testing.assert_allclose(
        kiln.load(tmp_path / "pw.kiln").run({"input": x})["output"], ort_run(m, {"input": x})[0], rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("c", [58, 116])
def test_pointwise_rule_on_shufflenet_channels(c):
    """ShuffleNet v2's 1x1 convs: 58 and 116 channels, which no block of 8 divides, ran on the generic NCHW
    rule (conv2d_nchw_oc) at ~50 GFLOP/s. On 32 registers they take a 29-channel register tile (4 on 16
    registers), and the kernel matches numpy."""
    x, w, b = rnd(1, c, 28, 28), rnd(c, c, 1, 1, seed=1), rnd(1, c, 1, 1, seed=2)
    vx, vw, vb = _var("x", x.shape), _var("w", w.shape), _var("b", b.shape)
    func = _kernel(
        lambda bb: relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(vx, vw)), vb))), [vx, vw, vb]
    )
    assert pointwise_rows(c, 32) == 29 and pointwise_rows(c, 16) == (4 if c == 116 else 0)
    for registers in (32, 16):
        sch = s_tir.Schedule(func)
        kind, anchor = classify(sch)
        assert kind == "conv2d_nchw"
        if not pointwise_rows(c, registers):
            with pytest.raises(s_tir.ScheduleError, match="register tile"):
                RULES[("cpu", kind)](sch, anchor, 16, registers=registers)
            continue
        RULES[("cpu", kind)](sch, anchor, 16, registers=registers)
        ref = np.maximum(_conv_nchw_ref(x, w, 0) + b, 0)
        np.testing.assert_allclose(_run(sch.mod["main"], [x, w, b]), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lanes, hw", [(16, 14), (8, 7)])
def test_pointwise_rule_pads_rows_a_little_narrower_than_a_vector(lanes, hw):
    """ShuffleNet's 116-channel 1x1 convs on 14 x 14 maps (196 pixels: no whole vectors) ran on the generic rule;
    each row is now padded to one vector (14 -> 16 lanes, 7 -> 8 on AVX2), the conv computed over whole vectors and
    the real columns written: the kernel has the padded input copy and matches numpy. (116 @ 14 x 14 on Zen 4:
    77.8 -> 48.7 us alone; shufflenet_v2_x1_0_dynamo 4.97 -> 4.08 ms p50, same outputs.)"""
    c = 116
    x, w = rnd(1, c, hw, hw), rnd(c, c, 1, 1, seed=1)
    vx, vw = _var("x", x.shape), _var("w", w.shape)
    func = _kernel(lambda bb: relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(vx, vw))), [vx, vw])
    sch = s_tir.Schedule(func)
    kind, anchor = classify(sch)
    RULES[("cpu", kind)](sch, anchor, lanes, registers=32 if lanes == 16 else 16)
    text = sch.mod["main"].script()
    assert f"T.int64({hw}), T.int64({lanes})" in text and f"T.vectorized(T.int64({lanes}))" in text
    np.testing.assert_allclose(
        _run(sch.mod["main"], [x, w]), np.maximum(_conv_nchw_ref(x, w, 0), 0), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize(
    "hw, n",
    [((16, 20), 1), ((18, 22), 1), ((7, 10), 1), ((7, 10), 3)],
    ids=["F4x4", "F4x4_overhang", "F2x2_overhang", "F2x2_batch3"],
)
def test_winograd_rule(hw, n):
    """A Winograd conv + bias + ReLU kernel (the Winograd pass's compute, weights transformed at
    compile time): the registry picks the winograd rule, and the scheduled kernel matches a direct
    conv in numpy; 16x20 outputs take F(4x4, 3x3), 18x22 too (the last tiles overhang the
    output), 7x10 F(2x2, 3x3) (overhanging by a row), also for a batch of 3 (one tile axis over all images)."""
    from kiln.compiler.winograd import conv2d_winograd_nchwc, tile_size, transform_weight

    x, w, b = rnd(n, 32, *hw), rnd(32, 32, 3, 3, seed=1), rnd(1, 32, 1, 1, seed=2)
    m = tile_size(*hw)
    assert m == {(16, 20): 4, (18, 22): 4, (7, 10): 2}[hw]
    wc = w.reshape(2, 16, 2, 16, 3, 3).transpose(0, 2, 4, 5, 3, 1)  # OIHW16i16o
    u = transform_weight(wc, m)
    vx, vu, vb = _var("x", (n, 2, *hw, 16)), _var("u", u.shape), _var("b", (1, 2, 1, 1, 16))
    func = _kernel(
        lambda bb: relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(bb.call_te(conv2d_winograd_nchwc, vx, vu, m)), vb))),
        [vx, vu, vb],
    )
    sch = s_tir.Schedule(func)
    kind, anchor = classify(sch)
    assert kind == "winograd"
    RULES[("cpu", kind)](sch, anchor, 16)
    blocked = lambda a: a.reshape(a.shape[0], 2, 16, *a.shape[2:]).transpose(0, 1, 3, 4, 2)
    ref = blocked(np.maximum(_conv_nchw_ref(x, w, 1) + b, 0))
    inputs = [blocked(x), u, blocked(b)]
    np.testing.assert_allclose(_run(sch.mod["main"], inputs), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_run(func, inputs), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "k, stride, clamp, o",
    [(3, 1, (0.0, 6.0), 24), (3, 2, None, 32), (5, 1, (0.0, np.inf), 24)],
    ids=["3x3_relu6", "3x3_stride2_halves", "5x5_relu"],
)
def test_depthwise_pointwise_rule(k, stride, clamp, o):
    """The depthwise + 1x1 conv kernel (FuseDepthwisePointwise's compute) + the projection's bias:
    the registry picks its rule, and the scheduled kernel matches numpy (depthwise per channel,
    bias, clamp, then the 1x1 conv); 32 channels (NCHW16c) -> o (NCHW8c), 9x11 input; stride 2
    leaves 5 output rows, so the 4 output blocks are split in halves across threads too."""
    from kiln.compiler.passes.fuse_depthwise_pointwise import dwpw_conv2d

    x, wd, bd, wp, bp = (
        rnd(1, 32, 9, 11),
        rnd(32, 1, k, k, seed=1),
        rnd(32, seed=2),
        rnd(o, 32, seed=3),
        rnd(1, o, 1, 1, seed=4),
    )
    p = k // 2
    dw = np.concatenate([_conv_nchw_ref(x[:, c : c + 1], wd[c : c + 1], p) for c in range(32)], axis=1)[
        :, :, ::stride, ::stride
    ] + bd.reshape(1, 32, 1, 1)
    lo, hi = clamp or (-np.inf, np.inf)
    ref = np.einsum("nchw,oc->nohw", np.clip(dw, lo, hi), wp) + bp
    oh, ow = ref.shape[2:]
    vx, vwd, vbd = _var("x", (1, 2, 9, 11, 16)), _var("wd", (2, 1, k, k, 1, 16)), _var("bd", (1, 2, 1, 1, 16))
    vwp, vbp = _var("wp", (o // 8, 2, 1, 1, 16, 8)), _var("bp", (1, o // 8, 1, 1, 8))
    func = _kernel(
        lambda bb: relax.op.add(
            bb.emit(bb.call_te(dwpw_conv2d, vx, vwd, vbd, vwp, [stride, stride], [p] * 4, lo, hi)), vbp
        ),
        [vx, vwd, vbd, vwp, vbp],
    )
    sch = s_tir.Schedule(func)
    kind, anchor = classify(sch)
    assert kind == "depthwise_pointwise"
    RULES[("cpu", kind)](sch, anchor, 16)
    assert int(sch.get(sch.get_loops(anchor)[0]).extent) == oh * (
        2 if oh < 8 else 1
    )  # the parallel loop: rows (x 2 halves)
    blocked = lambda a, b: a.reshape(a.shape[0], -1, b, *a.shape[2:]).transpose(0, 1, 3, 4, 2)
    inputs = [
        blocked(x, 16),
        wd.reshape(2, 16, 1, k, k).transpose(0, 2, 3, 4, 1)[:, :, :, :, None, :],
        blocked(bd.reshape(1, 32, 1, 1), 16),
        wp.reshape(o // 8, 8, 2, 16, 1, 1).transpose(0, 2, 4, 5, 3, 1),
        blocked(bp, 8),
    ]
    assert ref.shape == (1, o, oh, ow)
    np.testing.assert_allclose(_run(sch.mod["main"], inputs), blocked(ref, 8), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_run(func, inputs), blocked(ref, 8), rtol=1e-4, atol=1e-4)


def test_strided_lanes_are_detected():
    """A stride-2 NCHW pool reads W with a stride over its last spatial iterator (its lanes would gather:
    they run as unrolled scalars); a blocked conv reads its lanes contiguously."""
    vq = _var("q", (1, 8, 13, 13))
    vx, vw = _var("x", (1, 1, 9, 9, 16)), _var("w", (2, 1, 3, 3, 16, 16))
    cases = [
        (lambda bb: relax.op.nn.max_pool2d(vq, pool_size=[3, 3], strides=[2, 2], padding=[1, 1]), [vq], True),
        (lambda bb: relax.op.nn.max_pool2d(vq, pool_size=[3, 3], strides=[1, 1], padding=[1, 1]), [vq], False),
        (
            lambda bb: relax.op.nn.conv2d(
                vx, vw, strides=[2, 2], padding=[1, 1], data_layout="NCHW16c", kernel_layout="OIHW16i16o"
            ),
            [vx, vw],
            False,
        ),
    ]
    for body, params, strided in cases:
        sch = s_tir.Schedule(_kernel(body, params))
        _, anchor = classify(sch)
        rules.inline_all_but(sch, [anchor])
        assert rules.strided_lanes(sch, anchor) == strided


def test_blocked_conv_reads_weights_in_memory_order():
    """The NCHWc conv rule runs the reduction as (ic / 16, kh, kw, ic % 16) (weights [O/16, I/16, KH, KW,
    16, 16] in memory order); a 1x1 conv keeps its one channel loop."""
    for k, order in ((3, [("ic_0", 2), ("kh", 3), ("kw", 3), ("ic_1", 16)]), (1, [("ic", 32), ("kh", 1), ("kw", 1)])):
        vx, vw = _var("x", (1, 2, 9, 9, 16)), _var("w", (1, 2, k, k, 16, 16))
        sch = s_tir.Schedule(
            _kernel(
                lambda bb, vx=vx, vw=vw, k=k: relax.op.nn.conv2d(
                    vx, vw, padding=[k // 2] * 2, data_layout="NCHW16c", kernel_layout="OIHW16i16o"
                ),
                [vx, vw],
            )
        )
        _, anchor = classify(sch)
        RULES[("cpu", "conv2d")](sch, anchor, 16)
        loops = [
            (str(lp.loop_var), int(lp.extent))
            for lp in map(sch.get, sch.get_loops(sch.get_sblock("conv2d_NCHWc_update")))
        ]
        assert [lp for lp in loops if lp[0].startswith(("ic", "kh", "kw"))] == order


def test_matmul_register_tile_fits_the_registers():
    """rows x column vectors: accumulators + weight vectors + a broadcast within the vector registers,
    the most FMAs per load (AVX-512's 32 zmm: 4 x 4 on 128 rows; AVX2's 16 ymm: 4 x 2)."""
    from kiln.schedules.rules.matmul import tile_shape

    assert tile_shape(128, 8, 32) == (4, 4)
    assert tile_shape(128, 8, 16) == (4, 2)
    assert tile_shape(96, 5, 32) == (4, 5)
    assert tile_shape(7, 3, 16) == (7, 1)  # 7 rows (prime): 7 FMAs per 8 loads beats 1 x 3's 3 per 4
    for rows, vecs, regs in [(128, 8, 32), (128, 8, 16), (96, 5, 32), (12, 2, 16), (6, 32, 32)]:
        r, v = tile_shape(rows, vecs, regs)
        assert rows % r == 0 and vecs % v == 0 and r * v + v + 1 <= regs


@pytest.mark.parametrize("registers", [16, 32])
def test_matmul_tile_numerics_per_register_file(registers):
    from kiln.schedules.rules.matmul import matmul_tiled

    a, m = rnd(1, 64, 48, seed=1), rnd(48, 64, seed=2)
    va, vm = _var("a", (1, 64, 48)), _var("m", (48, 64))
    func = _kernel(lambda bb: relax.op.matmul(va, vm), [va, vm])
    sch = s_tir.Schedule(func)
    _, anchor = classify(sch)
    matmul_tiled(sch, anchor, 8 if registers == 16 else 16, registers=registers)
    np.testing.assert_allclose(_run(sch.mod["main"], [a, m]), a.astype(np.float64) @ m, rtol=1e-4, atol=1e-4)


def test_matmul_over_steps_of_batch_one_tiles_the_steps():
    """[T, 1, K] x [K, N] (a recurrence's input projection, T steps of batch 1): the steps are the tile's rows.
    With the unit row axis alone the rule refused it and the fallback read every weight vector once per step
    (ddddocr's LSTM projections, [20, 1, 512] x [512, 2048]: 0.70 -> 0.31 ms on Zen 4)."""
    from kiln.schedules.rules.matmul import matmul_tiled

    a, m = rnd(20, 1, 48, seed=1), rnd(48, 64, seed=2)
    va, vm = _var("a", (20, 1, 48)), _var("m", (48, 64))
    func = _kernel(lambda bb: relax.op.matmul(va, vm), [va, vm])
    sch = s_tir.Schedule(func)
    _, anchor = classify(sch)
    matmul_tiled(sch, anchor, 16, registers=32)
    text = sch.mod["main"].script()
    assert re.search(r"T\.unroll\(T\.int64\((4|5|10)\)\)", text), text  # several steps per register tile
    np.testing.assert_allclose(_run(sch.mod["main"], [a, m]), a.astype(np.float64) @ m, rtol=1e-4, atol=1e-4)


def test_row_reductions_are_vectorized():
    """Layer norm's two reductions each become a lane-wide partial sum (an rfactor block whose lane loop
    is vectorized) under one parallel loop over rows."""
    vln, vg, vbe = _var("x", (2, 12, 64)), _var("g", (64,)), _var("be", (64,))
    func = _kernel(lambda bb: relax.op.nn.layer_norm(vln, vg, vbe, axes=[-1]), [vln, vg, vbe])
    sch = s_tir.Schedule(func)
    _, anchor = classify(sch)
    RULES[("cpu", "multi_reduction")](sch, anchor, 16)
    text = sch.mod["main"].script()
    assert text.count('T.sblock("') >= 5 and text.count("_rf[") >= 4  # two partial-sum blocks
    assert text.count("T.vectorized(") >= 3 and text.count("T.parallel(") == 1


def test_blocked_quantize_is_vectorized_without_gathers():
    """A quantize of an NCHW16c tensor (Kiln's int8 flow between blocks), compiled for an explicit AVX-512
    target, not run: relax.round legalizes to tirx.round, whose vector loop stays a vector loop. With topi's
    te.nearbyint (no TVectorizable) TVM left it scalar and LLVM gathered 16 strided floats per vector."""
    import re

    vx = _var("x", (1, 4, 8, 8, 16))

    def body(bb):
        r = bb.emit(relax.op.round(bb.emit(relax.op.multiply(vx, relax.const(np.float32(4.0))))))
        return relax.op.astype(relax.op.clip(r, 0, 255), "uint8")

    func = _kernel(body, [vx])
    sch = s_tir.Schedule(func)
    _, anchor = classify(sch)
    RULES[("cpu", "injective")](sch, anchor, 16)
    lib = tvm.tirx.build(
        tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
        target=tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}),
    )
    asm = lib.inspect_source("asm")
    assert re.search(r"vrndscaleps\s+\$\w+, %zmm", asm) and "gather" not in asm


@pytest.mark.parametrize("k,s,pads,include_pad", [(2, 2, [0] * 4, 0), (3, 2, [1] * 4, 0), (3, 1, [1] * 4, 1)])
def test_blocked_avg_pool_matches_onnxruntime(tmp_path, k, s, pads, include_pad):
    """A blocked AveragePool after a conv (densenet121's transitions): TOPI annotates the division, not
    the sum; reduction_tiled anchors on the sum and takes the division into its tile."""
    from helpers import check_against_ort, make_model, rand
    from onnx import helper

    x = rand(1, 32, 13, 13)
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "AveragePool",
            ["c"],
            ["output"],
            kernel_shape=[k, k],
            strides=[s, s],
            pads=pads,
            count_include_pad=include_pad,
        ),
    ]
    model = make_model(nodes, {"input": x}, ["output"], {"w": rand(32, 32, 3, 3, seed=1) * 0.2})
    out = check_against_ort(model, {"input": x}, tmp_path)
    assert out["output"].shape[1] == 32


@pytest.mark.parametrize("width", [13, 26, 11])
def test_a_1x1_conv_on_a_width_without_a_small_divisor_matches_onnxruntime(tmp_path, width):
    """1x1 convs on 13/26/11-wide maps (SqueezeNet's classifier, YOLO's grids): on 32 registers their tile is
    a row of up to 16 pixels (SqueezeNet's 512 -> 1000 classifier 1.77 -> 1.06 ms on Zen 4), elsewhere
    pixels x output blocks; with a bias and ReLU epilogue, against onnxruntime."""
    from helpers import check_against_ort, make_model, rand
    from onnx import helper

    x = rand(1, 64, width, width)
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"]),
        helper.make_node("Relu", ["c"], ["output"]),
    ]
    model = make_model(nodes, {"input": x}, ["output"], {"w": rand(48, 64, 1, 1, seed=1) * 0.2, "b": rand(48, seed=2)})
    assert check_against_ort(model, {"input": x}, tmp_path)["output"].shape == (1, 48, width, width)


@pytest.mark.parametrize("cols", [129, 37])
def test_matmul_with_no_vector_width_is_padded(cols):
    """129 or 37 columns have no vector width of 4 or more: the columns are padded to whole vectors (the
    weights' padded copy and the epilogue over the real columns are blocks of their own), not left to
    reduction_tiled's scalar columns (enh_conv_bilstm's output layer, 9x slower)."""
    from kiln.schedules.rules.matmul import matmul_tiled

    a, m, b = rnd(1, 20, 48, seed=1), rnd(48, cols, seed=2), rnd(cols, seed=3)
    va, vm, vb = _var("a", (1, 20, 48)), _var("m", (48, cols)), _var("b", (cols,))
    func = _kernel(
        lambda bb: relax.op.sigmoid(bb.emit(relax.op.add(bb.emit(relax.op.matmul(va, vm)), vb))), [va, vm, vb]
    )
    sch = s_tir.Schedule(func)
    _, anchor = classify(sch)
    matmul_tiled(sch, anchor, 8, registers=16)
    text = sch.mod["main"].script()
    assert "_pad" in text and len(re.findall(r"T\.vectorized\((T\.int64\()?8\)", text)) >= 2
    want = 1 / (1 + np.exp(-(a.astype(np.float64) @ m + b)))
    np.testing.assert_allclose(_run(sch.mod["main"], [a, m, b]), want, rtol=1e-4, atol=1e-5)


def test_broadcast_epilogue_outside_the_tile_is_parallel_and_vectorized():
    """An SE block's 1x1 conv on the pooled [1, C, 1, 1] vector, fused with the scale's broadcast multiply over
    the feature map: the multiply writes more than the conv's tile, so it stays at the root, where it ran as
    one serial scalar loop (mobilenet_v3_small dynamo's, 68 us); vectorize_leftovers gives it the lanes."""
    from kiln.schedules.rules.apply import first_rule_that_applies

    x, w, f = rnd(1, 16, 1, 1, seed=1), rnd(32, 16, 1, 1, seed=2), rnd(1, 32, 16, 16, seed=3)
    vx, vw, vf = _var("x", (1, 16, 1, 1)), _var("w", (32, 16, 1, 1)), _var("f", (1, 32, 16, 16))
    func = _kernel(
        lambda bb: relax.op.multiply(bb.emit(relax.op.sigmoid(bb.emit(relax.op.nn.conv2d(vx, vw)))), vf), [vx, vw, vf]
    )
    kind, sch = first_rule_that_applies(func, "cpu", 16, 32)
    assert sch is not None
    text = sch.mod["main"].script()
    loop = re.search(r"for ([^\n]*):\n\s*with T\.sblock\(\"T_multiply\"\)", text)
    assert loop and "T.vectorized(" in loop.group(1), loop  # the multiply's innermost loop, serial before
    assert "T.parallel(" in text.split('T.sblock("conv2d_nchw_intermediate_local")')[1]
    conv = np.einsum("oi,i->o", w[:, :, 0, 0].astype(np.float64), x[0, :, 0, 0])
    want = (1 / (1 + np.exp(-conv)))[None, :, None, None] * f
    np.testing.assert_allclose(_run(sch.mod["main"], [x, w, f]), want, rtol=1e-4, atol=1e-5)
