"""FoldAffineChains: a run of constant multiplies, adds and subtracts becomes x * A + B (numerics against the
unfolded module); a value read twice keeps its own binding and the result stays right; a run already in that
form, a broadcasting constant and a non-float run are left alone."""

import numpy as np
import tvm
from test_passes import rnd, run_mod
from tvm import relax

from kiln.compiler.ir import calls, op_name
from kiln.compiler.passes import FoldAffineChains


def _module(steps, shape=(1, 4, 3, 3, 16), extra_reader=None):
    """main(x) = the steps applied in order; `extra_reader`: the index of a step whose value is also added to the
    result (read twice)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y, seen = x, []
            for op, c in steps:
                y = bb.emit(op(y, relax.const(np.asarray(c, np.float32))))
                seen.append(y)
            if extra_reader is not None:
                y = bb.emit(relax.op.add(y, seen[extra_reader]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod) -> list[str]:
    return [op_name(c) for c in calls(mod["main"])]


def test_a_run_of_multiplies_and_adds_becomes_one_multiply_add():
    per_channel = rnd(1, 4, 1, 1, 16, seed=1)
    steps = [
        (relax.op.multiply, per_channel),
        (relax.op.add, rnd(1, 4, 1, 1, 16, seed=2)),
        (relax.op.multiply, 17.25),
        (relax.op.subtract, 0.5),
        (relax.op.multiply, per_channel),
    ]
    before = _module(steps)
    p = FoldAffineChains()
    after = p(before)
    assert p.stats["affine_chains_folded"] == 1
    assert _ops(after) == ["relax.multiply", "relax.add"]
    x = rnd(1, 4, 3, 3, 16, seed=3)
    np.testing.assert_allclose(run_mod(after, x), run_mod(before, x), rtol=1e-5, atol=1e-5)


def test_a_value_read_twice_is_kept():
    steps = [(relax.op.multiply, 3.0), (relax.op.multiply, 0.25), (relax.op.add, 1.0), (relax.op.multiply, 2.0)]
    before = _module(steps, extra_reader=1)
    p = FoldAffineChains()
    after = p(before)
    assert p.stats["affine_chains_folded"] == 2  # x * 3 * 0.25 (read twice), then its own run to the end
    x = rnd(1, 4, 3, 3, 16, seed=4)
    np.testing.assert_allclose(run_mod(after, x), run_mod(before, x), rtol=1e-5, atol=1e-5)


def test_what_is_left_alone():
    p = FoldAffineChains()
    normal = _module([(relax.op.multiply, 2.0), (relax.op.add, 1.0)])
    tvm.ir.assert_structural_equal(p(normal), normal)  # already x * A + B
    widening = _module([(relax.op.multiply, rnd(2, 1, 4, 3, 3, 16)), (relax.op.multiply, 2.0)])
    tvm.ir.assert_structural_equal(p(widening), widening)  # the constant broadcasts x to a larger shape
    ranged = _module([(relax.op.multiply, 2.0**100), (relax.op.multiply, 2.0**-100), (relax.op.multiply, 3.0)])
    tvm.ir.assert_structural_equal(p(ranged), ranged)  # powers of two that mean the range (BitCast's decomposition)
    assert p.stats["affine_chains_folded"] == 0


def test_a_divide_by_a_constant_is_a_multiply():
    """x / sqrt(2) (an erf GELU's) as x * (1 / sqrt(2)): no vdivps; at most a last-bit difference."""
    before = _module([(relax.op.divide, np.sqrt(2.0))])
    p = FoldAffineChains()
    after = p(before)
    assert p.stats["affine_chains_folded"] == 1 and _ops(after) == ["relax.multiply"]
    x = rnd(1, 4, 3, 3, 16, seed=5)
    np.testing.assert_allclose(run_mod(after, x), run_mod(before, x), rtol=2e-7, atol=0)
    zero = _module([(relax.op.divide, 0.0)])
    tvm.ir.assert_structural_equal(p(zero), zero)  # x / 0 keeps its infinities and NaNs
