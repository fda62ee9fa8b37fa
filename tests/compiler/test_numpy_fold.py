"""numpy_fold: constant folding in NumPy gives exactly the module TVM's FoldConstant gives (values
included: structural equality compares constants' data), and leaves to it what NumPy would not
compute the same way."""

import numpy as np
import pytest
import tvm
from tvm import relax

from kiln.compiler.ir import calls
from kiln.compiler.passes import numpy_fold


def _module(make, *consts):
    """main(x) = x + make(constants...) (cast to float32): the folded part is make's; x keeps main
    from being all constant."""
    cs = [relax.const(c) for c in consts]
    bb = relax.BlockBuilder()
    with bb.function("probe", []):
        with bb.dataflow():
            ty = bb.emit(make(*cs)).ty
            out = bb.emit_output(relax.const(0.0))
        bb.emit_func_output(out)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(ty.shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            v = bb.emit(make(*cs))
            if str(ty.dtype) != "float32":
                v = bb.emit(relax.op.astype(v, "float32"))
            out = bb.emit_output(relax.op.add(x, v))
        bb.emit_func_output(out)
    return bb.get()


W = np.random.default_rng(0).standard_normal((8, 6, 3, 3)).astype("float32")
V = np.array([0.5, np.nan, -np.inf, 2.0], "float32")
OPS = {
    "layout_transform": lambda w: relax.op.layout_transform(
        w, lambda o, i, h, w_: (o // 4, i // 2, h, w_, i % 2, o % 4)
    ),
    "layout_transform_padded": lambda w: relax.op.layout_transform(
        w, lambda o, i, h, w_: (o // 16, i, h, w_, o % 16), pad_value=0.0
    ),
    "permute_dims": lambda w: relax.op.permute_dims(w, [1, 0, 3, 2]),
    "reshape": lambda w: relax.op.reshape(w, (48, 9)),
    "multiply": lambda w: relax.op.multiply(w, relax.const(np.float32(0.3))),
}
NAN_OPS = {
    "where_isnan": lambda v: relax.op.where(relax.op.isnan(v), relax.const(np.float32(-np.inf)), v),
    "isinf": lambda v: relax.op.isinf(v),
    "rank_0": lambda v: relax.op.where(  # ONNX Clip's bound: a 0-d constant stays 0-d
        relax.op.isnan(relax.const(np.float32(6))), relax.const(np.float32(np.inf)), relax.const(np.float32(6))
    ),
    "greater": lambda v: relax.op.greater(v, relax.const(np.float32(1.0))),
    "to_int": lambda v: relax.op.astype(relax.op.where(relax.op.isnan(v), relax.const(np.float32(0)), v), "int32"),
}


def _folded_by_tvm(mod):
    return relax.transform.DeadCodeElimination(["main"])(relax.transform.FoldConstant()(mod))


@pytest.mark.parametrize("name", list(OPS) + list(NAN_OPS))
def test_the_numpy_fold_is_the_module_tvm_folds(name):
    mod = _module(OPS[name], W) if name in OPS else _module(NAN_OPS[name], V)
    ours = relax.transform.FoldConstant()(numpy_fold.fold(mod))
    tvm.ir.assert_structural_equal(ours, _folded_by_tvm(mod), map_free_vars=True)


def test_numpy_folds_the_layout_ops_itself_and_leaves_float_to_int_casts():
    """What numpy_fold computes leaves no call for TVM's FoldConstant (one LLVM build each); a cast from
    float to an integer (NaN, out of range: no defined result to match) is left to it."""
    for mod in [_module(make, W) for make in OPS.values()] + [_module(NAN_OPS["where_isnan"], V)]:
        assert [c.op.name for c in calls(numpy_fold.fold(mod)["main"])] == ["relax.add"]
    ours = numpy_fold.fold(_module(NAN_OPS["to_int"], V))
    assert "relax.astype" in [c.op.name for c in calls(ours["main"]) if isinstance(c.op, tvm.ir.Op)]
