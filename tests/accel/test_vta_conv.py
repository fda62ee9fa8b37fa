"""Convolutions compiled for the simulated accelerator are bit-exact with the same integer
arithmetic in numpy, across the tiling edge cases: input-channel tiling on odd channel counts,
both loop orders, single and double buffering, a residual input."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.accel.vta import conv
from kiln.accel.vta.config import VTAConfig
from kiln.compiler.backends.vta import codegen

CFG = VTAConfig.parse()


def _layer(c, o, h, w, k, s, p, relu=True, residual=False, seed=0):
    rng = np.random.default_rng(seed)
    wf = rng.standard_normal((o, c, k, k))
    sx, sy = 0.02, 0.02 * 0.05 * np.sqrt(c * k * k)  # output scale ~ the accumulator's spread: values spread out
    wq, sw, shift = conv.shift_quantize(wf, sx, sy)
    bias = conv.rounded_bias(rng.integers(-3000, 3000, o), shift).astype(np.int32)
    rmul = rng.integers(1, 300, o).astype(np.int32) if residual else None
    layer = conv.ConvLayer(wq, bias, shift, relu, (1, c, h, w), (s, s), (p, p, p, p), rmul)
    x = rng.integers(-127, 128, layer.in_shape).astype(np.int8)
    r = rng.integers(-127, 128, layer.out_shape).astype(np.int8) if residual else None
    return layer, x, r


def _check(layer, x, r, schedule=None):
    prog = codegen.compile_conv(layer, CFG, schedule)
    out, st = codegen.run(prog, x, CFG, r)
    ref = conv.reference(layer, x, r)
    assert out.shape == ref.shape == layer.out_shape
    np.testing.assert_array_equal(out, ref)
    assert len(np.unique(ref)) > 20  # the requantization produces a spread of values, not a constant
    c, k = layer.in_shape[1], layer.weight.shape[2]
    ib, ob = -(-c // 16), -(-layer.weight.shape[0] // 16)
    _, _, oh, ow = layer.out_shape
    bias_gemm = "bwgt" in prog.consts  # the bias as one more GEMM pass (ONES x bias weights) over the outputs
    assert st.gemm_ops == ob * (ib * k * k + bias_gemm) * oh * ow  # every MAC block exactly once
    assert st.cycles >= st.gemm_cycles and st.busy["compute"] >= st.gemm_cycles
    assert codegen.cycles(prog, CFG).cycles == st.cycles  # the tuner's timing-only run counts the same
    return prog, st


@pytest.mark.parametrize(
    "c,o,h,w,k,s,p,relu",
    [
        (16, 16, 8, 8, 3, 1, 1, True),  # one tile
        (20, 40, 9, 7, 3, 2, 1, False),  # channels not multiples of 16, odd sizes, stride 2, no ReLU
        (64, 64, 28, 28, 3, 1, 1, True),  # many tiles, double-buffered
        (32, 48, 10, 10, 1, 1, 0, True),  # 1x1
        (3, 16, 15, 15, 7, 2, 3, True),  # 7x7 stride 2 pad 3, 3 input channels
        (16, 32, 5, 5, 3, 1, 2, True),  # padding larger than needed (output bigger than input)
    ],
)
def test_conv_bit_exact(c, o, h, w, k, s, p, relu):
    _check(*_layer(c, o, h, w, k, s, p, relu))


@pytest.mark.parametrize(
    "schedule",
    [
        conv.Schedule(tco=2, th=3, tci=2),  # 7 input blocks in steps of 2: a 1-block tail step
        conv.Schedule(tco=3, th=4, tci=3, order="row"),  # rows outer: input rows stay, weights stream
        conv.Schedule(tco=1, th=9, tci=1, double=False),  # one buffer each, one input block a step
        conv.Schedule(tco=5, th=2, tci=7),  # all input channels at once, 5 of 5 oc blocks
    ],
)
def test_input_channel_tiling_odd_channels_bit_exact(schedule):
    """99 input channels (7 blocks, the last 3/16 full), 77 output channels (5 blocks)."""
    layer, x, r = _layer(99, 77, 9, 11, 3, 1, 1, seed=3)
    prog, st = _check(layer, x, r, schedule)
    assert prog.schedule == schedule


def test_residual_input_bit_exact():
    layer, x, r = _layer(40, 24, 9, 9, 3, 1, 1, residual=True, seed=5)
    _check(layer, x, r, conv.Schedule(tco=1, th=4, tci=2))
    with pytest.raises(ValueError, match="residual"):
        conv.reference(layer, x)


def test_big_layers_are_tiled_not_refused_and_inputs_not_refetched():
    """512 -> 512 channels, 7x7 (ResNet-18's last stage): input-channel steps make it fit, and a
    large output tile loads each input only once per output-channel tile."""
    rng = np.random.default_rng(0)
    layer = conv.ConvLayer(
        rng.integers(-127, 128, (512, 512, 3, 3)).astype(np.int8),
        np.zeros(512, np.int32),
        np.full(512, 20, np.int32),
        True,
        (1, 512, 7, 7),
        (1, 1),
        (1, 1, 1, 1),
    )
    s = conv.Schedule(tco=16, th=7, tci=3)
    st = codegen.cycles(codegen.compile_conv(layer, CFG, s), CFG)
    inp_bytes = 512 * 7 * 7  # one copy of the input
    assert st.load_bytes["wgt"] == 512 * 512 * 9 + 32 * 256  # every weight once, and the bias weights
    assert st.load_bytes["inp"] == 2 * inp_bytes + 16  # once per output-channel tile (2 of 16 blocks), + ONES
    assert st.cycles < 1.07 * st.gemm_cycles  # GEMM-bound
    big = conv.ConvLayer(
        np.zeros((16, 4096, 3, 3), np.int8), layer.bias[:16], layer.shift[:16], True, (1, 4096, 8, 8), (1, 1)
    )
    assert conv.plan(big, CFG).tci < 256  # 256 input blocks: stepped, not refused


def test_schedules_that_do_not_fit_are_refused():
    layer, _, _ = _layer(16, 16, 8, 8, 3, 1, 1)
    with pytest.raises(conv.NotOffloadable, match="does not fit"):
        conv.check(layer, conv.Schedule(tco=1, th=8, tci=1), VTAConfig.parse("1x16_i8w8a32_15_8_18_17"))
    with pytest.raises(conv.NotOffloadable, match="padding"):
        pad = conv.ConvLayer(layer.weight, layer.bias, layer.shift, True, (1, 16, 8, 8), (1, 1), (16, 16, 16, 16))
        conv.plan(pad, CFG)
    with pytest.raises(Exception, match="order"):
        conv.Schedule(1, 1, 1, order="diagonal")


def test_shift_quantize_is_a_power_of_two_requantization():
    w = np.random.default_rng(1).standard_normal((8, 4, 3, 3))
    wq, sw, shift = conv.shift_quantize(w, 0.02, 0.1)
    np.testing.assert_allclose(0.02 * sw / 0.1, 2.0 ** -shift.astype(float))  # exactly 2^-shift per channel
    top = np.abs(wq.reshape(8, -1)).max(1)
    assert top.max() <= 127 and top.min() >= 64  # each channel uses at least half of the int8 range


def test_bias_in_the_gemm_is_exact_and_large_biases_fall_back_to_the_alu():
    b = np.array([0, 1, -1, 127, -64, 64, 240_000, -240_000, 12345, -98765], np.int64)
    w = conv.bias_weights(b, 16)
    np.testing.assert_array_equal(w.reshape(-1, 16)[:10].astype(np.int64) @ conv.ONES.astype(np.int64), b)
    assert conv.bias_weights(np.array([conv.BIAS_GEMM_MAX + 1]), 16) is None
    layer, x, r = _layer(20, 24, 6, 6, 3, 1, 1, seed=9)
    big = conv.ConvLayer(
        layer.weight, layer.bias + 10**6, layer.shift, True, layer.in_shape, layer.stride, layer.padding
    )
    prog = codegen.compile_conv(big, CFG)
    assert "bwgt" not in prog.consts  # the ALU adds it
    assert conv.alu_epilogue(big, CFG) == "ADD (bias), SHR, MAX, MIN"
    assert conv.alu_epilogue(layer, CFG) == "SHR, MAX, MIN"
    np.testing.assert_array_equal(codegen.run(prog, x, CFG)[0], conv.reference(big, x))
