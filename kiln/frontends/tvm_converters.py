"""Kiln's converters for the few ONNX ops TVM 0.27's importer handles only partly, installed into its
converter map for the duration of one import (wrapped, not forked: every other op is TVM's).

- TopK with k known only at run time (torchvision detection heads: k = min(candidates, topk) after a
  score threshold): TVM needs a constant k. Sort everything (relax topk with k = -1 returns all),
  then keep the first k along the axis with a dynamic strided slice.
- ConstantOfShape of the shape of a run-time-sized tensor (`shape_of`, not a literal shape): TVM converts
  only literal shapes or tensors; relax full takes the shape value as it is.
- Cast of such a shape value: made a tensor first (TVM's Cast converts only literal shapes).
- NonMaxSuppression on boxes of unknown shape (TVM's type inference crashed the process on them):
  match-cast to a symbolic shape first; non-constant limits are refused (TVM took its defaults).
- Slice bounds and NMS's box limit beyond int32 (exporters write INT64_MAX / sys.maxsize for "no limit"):
  clamped to INT32_MAX, the same value for any real tensor; TVM's legalization of run-time-sized
  tensors builds int32 index arithmetic and rejects the int64 literal."""
from __future__ import annotations

import contextlib

import numpy as np

INT32_MAX = int(np.iinfo(np.int32).max)


def _topk():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class TopK(f.TopK):
        @classmethod
        def _impl_v11(cls, bb, inputs, attr, params):
            import tvm
            if isinstance(f.get_constant(inputs[1], params), tvm.ir.GenericConst):
                return super()._impl_v11(bb, inputs, attr, params)
            data, k = inputs[0], inputs[1]
            ndim = data.ty.ndim
            axis = attr.get("axis", -1) % ndim
            if attr.get("sorted", 1) != 1:
                raise ValueError("TopK sorted must be 1 for Relax frontend")
            both = bb.normalize(relax.op.topk(data, -1, axis, ret_type="both", largest=attr.get("largest", 1), dtype="int64"))
            k = bb.normalize(relax.op.reshape(relax.op.astype(k, "int64"), [1]))
            big = np.iinfo(np.int32).max  # "to the end" (an int64 max overflows the int32 index arithmetic)

            def const(v):
                return relax.const(np.array(v, np.int64), "int64")
            end = bb.normalize(relax.op.concat([const([big] * axis), k, const([big] * (ndim - axis - 1))], axis=0)) \
                if ndim > 1 else k
            begin, step = const([0] * ndim), const([1] * ndim)
            outs = [bb.normalize(relax.op.dynamic_strided_slice(bb.normalize(relax.TupleGetItem(both, i)), begin, end, step))
                    for i in range(2)]
            return relax.Tuple(outs)
    return TopK


def _constant_of_shape():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class ConstantOfShape(f.ConstantOfShape):
        @classmethod
        def _impl_v9(cls, bb, inputs, attr, params):
            shape = inputs[0]
            if isinstance(shape, relax.ShapeExpr) or not isinstance(getattr(shape, "ty", None), relax.ShapeType):
                return super()._impl_v9(bb, inputs, attr, params)
            value = f.get_numpy(attr["value"]) if attr.get("value") is not None else np.zeros(1, np.float32)
            return relax.op.full(shape, relax.const(value.reshape(()), str(value.dtype)), str(value.dtype))
    return ConstantOfShape


def _cast():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Cast(f.Cast):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            x = inputs[0]
            if not isinstance(x, relax.ShapeExpr) and isinstance(getattr(x, "ty", None), relax.ShapeType):
                x = bb.normalize(relax.op.shape_to_tensor(x))
            inputs[0] = x
            return super()._impl_v13(bb, inputs, attr, params)
    return Cast


def _nms():
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class NonMaxSuppression(f.NonMaxSuppression):
        @classmethod
        def _impl_v10(cls, bb, inputs, attr, params):
            ins = inputs  # TVM's onnx_input (None past its end): edited in place
            for i in (0, 1):  # boxes, scores: give a tensor of unknown shape a symbolic one
                ty = ins[i].ty
                if isinstance(ty, relax.TensorType) and ty.shape is None and ty.ndim == 3:
                    dims = [tvm.tirx.Var(f"nms{i}_{d}", "int64") for d in range(3)]
                    ins[i] = bb.match_cast(ins[i], relax.TensorType(dims, ty.dtype))
            for i in (2, 3, 4):  # TVM would silently take its defaults for anything but a constant
                if i < len(ins) and ins[i] is not None:
                    ins[i] = f.get_constant(ins[i], params)
                    if not isinstance(ins[i], tvm.ir.GenericConst):
                        raise ValueError(f"NonMaxSuppression input {i} must be a constant")
            if len(ins) > 2 and ins[2] is not None:  # torchvision writes sys.maxsize: int32 index arithmetic
                ins[2] = _clamped(ins[2])
            return super()._impl_v10(bb, ins, attr, params)
    return NonMaxSuppression


def _clamped(c):
    """A constant int64 tensor with values beyond int32 clamped to +-INT32_MAX ("to the end", "no limit")."""
    from tvm import relax
    a = c.value.numpy()
    if a.dtype != np.int64 or np.abs(a).max(initial=0) <= INT32_MAX:
        return c
    return relax.const(np.clip(a, -INT32_MAX, INT32_MAX).astype(np.int64), "int64")


def _slice():
    import tvm
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Slice(f.Slice):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            for k in (1, 2):  # inputs is TVM's onnx_input (None past its end): edit it in place
                if isinstance(inputs[k], tvm.ir.GenericConst):
                    inputs[k] = _clamped(inputs[k])
            return super()._impl_v13(bb, inputs, attr, params)
    return Slice


OVERRIDES = {"TopK": _topk, "ConstantOfShape": _constant_of_shape, "Cast": _cast, "NonMaxSuppression": _nms,
             "Slice": _slice}


@contextlib.contextmanager
def kiln_converters():
    """TVM's converter map with Kiln's overrides, for the imports inside the block."""
    from tvm.relax.frontend.onnx import onnx_frontend as f
    original = f._get_convert_map
    extra = {name: make() for name, make in OVERRIDES.items()}

    def convert_map():
        return {**original(), **extra}
    f._get_convert_map = convert_map
    try:
        yield
    finally:
        f._get_convert_map = original
