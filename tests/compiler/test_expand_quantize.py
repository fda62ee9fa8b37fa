"""ExpandQuantize: a quantize of a value already on its grid is a cast, bit for bit the quantize it replaces; any
other per-tensor quantize becomes the float ops Kiln legalizes it to, so that FoldAffineChains folds its 1 / s into
the run of multiplies and adds before it (a QDQ model's BatchNorm between two roundings)."""

import numpy as np
import pytest
from test_passes import rnd, run_mod
from tvm import relax

from kiln.compiler.ir import calls, op_name
from kiln.compiler.passes import ExpandQuantize, FoldAffineChains

SHAPE = (1, 2, 8, 8, 16)


def _module(lo, hi, scale, q_scale, zp, dtype="uint8", bn=False):
    """main(x) = quantize(clip(round(x), lo, hi) * scale [* bn_scale + bn_bias], q_scale, zp)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            g = bb.emit(relax.op.clip(bb.emit(relax.op.round(x)), lo, hi))
            y = bb.emit(relax.op.multiply(g, relax.const(np.float32(scale))))
            if bn:
                y = bb.emit(relax.op.multiply(y, relax.const(np.abs(rnd(1, 2, 1, 1, 16, seed=5)) + 0.5)))
                y = bb.emit(relax.op.add(y, relax.const(rnd(1, 2, 1, 1, 16, seed=6))))
            c = lambda v, t: relax.const(np.asarray(v, t))
            out = bb.emit_output(relax.op.quantize(y, c(q_scale, "float32"), c(zp, dtype), axis=1, out_dtype=dtype))
        bb.emit_func_output(out)
    return bb.get()


def _x():
    return rnd(*SHAPE, seed=7) * 90


@pytest.mark.parametrize("lo,hi,zp,dtype", [(-120, 135, 120, "uint8"), (0, 255, 0, "uint8"), (-128, 127, 0, "int8")])
def test_a_value_on_the_grid_is_cast_exactly(lo, hi, zp, dtype):
    before = _module(lo, hi, 0.0731, 0.0731, zp, dtype)
    p = ExpandQuantize()
    after = p(before)
    assert p.stats["quantizes_on_grid"] == 1 and "relax.quantize" not in [op_name(c) for c in calls(after["main"])]
    np.testing.assert_array_equal(run_mod(after, _x()), run_mod(before, _x()))


def test_the_grid_arithmetic_holds_for_every_code():
    """(n * s) * (1 / s) rounds back to n for every code n and any scale: the quantize changes nothing on the grid."""
    n = np.arange(-255, 256, dtype=np.float32)
    for s in np.geomspace(1e-4, 1e3, 2001).astype(np.float32):
        assert (np.round((n * s) * (np.float32(1) / s)) == n).all(), s


def test_another_scale_or_range_is_expanded_and_folds():
    p = ExpandQuantize()
    other_scale = _module(-120, 135, 0.0731, 0.05, 120)
    out_of_range = _module(-120, 135, 0.0731, 0.0731, 130)  # 135 + 130 does not fit a byte: the clip matters
    bn = _module(-120, 135, 0.0731, 0.05, 3, bn=True)
    for before in (other_scale, out_of_range, bn):
        after = p(before)
        np.testing.assert_array_equal(run_mod(after, _x()), run_mod(before, _x()))
    assert p.stats == {"quantizes_on_grid": 0, "quantizes_expanded": 3}
    folded = FoldAffineChains()(p(bn))  # BatchNorm's multiply-add and the quantize's 1 / s: one multiply-add
    ops = [op_name(c) for c in calls(folded["main"])]
    assert ops.count("relax.multiply") == 1 and ops.count("relax.round") == 2, ops
    got, want = run_mod(folded, _x()).astype(int), run_mod(bn, _x()).astype(int)
    assert np.abs(got - want).max() <= 1 and (got != want).mean() < 0.01  # only values on a rounding boundary move
