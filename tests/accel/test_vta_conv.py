"""Convolutions compiled for the simulated accelerator are bit-exact with the same integer
arithmetic in numpy, across the tiling edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.accel.vta import conv
from kiln.accel.vta.config import VTAConfig

CFG = VTAConfig.parse()


def _layer(c, o, h, w, k, s, p, relu=True, seed=0):
    rng = np.random.default_rng(seed)
    wt = rng.integers(-127, 128, (o, c, k, k)).astype(np.int8)
    bound = c * k * k * 127 * 127
    m, s1, s2 = conv.requant_params(20 * 127.0 / bound * rng.uniform(0.5, 1, o), bound)
    layer = conv.ConvLayer(
        wt, rng.integers(-5000, 5000, o).astype(np.int32), m, s1, s2, relu, (1, c, h, w), (s, s), (p, p, p, p)
    )
    return layer, rng.integers(-127, 128, layer.in_shape).astype(np.int8)


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
    layer, x = _layer(c, o, h, w, k, s, p, relu)
    prog = conv.compile_conv(layer, CFG)
    out, st = conv.run(prog, x, CFG)
    ref = conv.reference(layer, x)
    assert out.shape == ref.shape == layer.out_shape
    np.testing.assert_array_equal(out, ref)
    assert len(np.unique(ref)) > 20  # the requantization produces a spread of values, not a constant
    ib, ob = -(-c // 16), -(-o // 16)
    _, _, oh, ow = layer.out_shape
    assert st.gemm_ops == ob * ib * k * k * oh * ow  # every MAC block exactly once
    assert st.cycles >= st.gemm_cycles and st.busy["compute"] >= st.gemm_cycles


def test_stream_round_trips_through_its_encoding():
    from kiln.accel.vta import isa

    layer, _ = _layer(16, 32, 8, 8, 3, 1, 1)
    prog = conv.compile_conv(layer, CFG)
    raw = prog.stream(CFG)
    assert len(raw) == 16 * len(prog.insns) and isa.encode_stream(isa.decode_stream(raw, CFG), CFG) == raw


def test_layers_that_do_not_fit_are_refused():
    layer, _ = _layer(16, 16, 8, 8, 3, 1, 1)
    big = conv.ConvLayer(
        np.zeros((16, 2048, 3, 3), np.int8), layer.bias, layer.mult, 0, 0, True, (1, 2048, 8, 8), (1, 1), (1, 1, 1, 1)
    )
    with pytest.raises(conv.NotOffloadable, match="fits"):
        conv.plan(big, CFG)
    with pytest.raises(conv.NotOffloadable, match="padding"):
        conv.plan(
            conv.ConvLayer(layer.weight, layer.bias, layer.mult, 0, 0, True, (1, 16, 8, 8), (1, 1), (16, 16, 16, 16)),
            CFG,
        )


def test_requant_params_fit_32_bits():
    m, s1, s2 = conv.requant_params(np.array([1e-4, 3e-5]), 2**26)
    assert m.max() <= 255 and m.min() >= 1
    assert 2**26 / 2**s1 * 255 < 2**31
    np.testing.assert_allclose(m / 2.0 ** (s1 + s2), [1e-4, 3e-5], rtol=0.02)
