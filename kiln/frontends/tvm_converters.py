"""Kiln's converters for the few ONNX ops TVM 0.27's importer handles only partly, installed into its
converter map for the duration of one import, seen by the importing thread only, one import at a time
(kiln_converters; wrapped, not forked: every other op is TVM's).

- TopK with k known only at run time (torchvision detection heads: k = min(candidates, topk) after a
  score threshold): TVM needs a constant k. Sort everything (relax topk with k = -1 returns all),
  then keep the first k along the axis: k becomes a symbolic dim (tensor_to_shape + match_cast) and the
  slice a strided_slice ending at it, so the result has a shape (k) downstream ops can be legalized with.
- ConstantOfShape of the shape of a run-time-sized tensor (`shape_of`, not a literal shape): TVM converts
  only literal shapes or tensors; relax full takes the shape value as it is.
- Cast of such a shape value: made a tensor first (TVM's Cast converts only literal shapes).
- NonMaxSuppression (tvm_nms.py): its limit and thresholds as run-time inputs (TVM took its defaults).
- GatherElements, GatherND, ScatterElements, ScatterND, MaxUnpool and RoiAlign's batch index
  (tvm_indices.py): run-time indices clamped into the data (TVM's kernels read and wrote wherever an index
  of 10**9 pointed: segfaults).
- Slice bounds beyond int32 (exporters write INT64_MAX / sys.maxsize for "no limit"):
  clamped to INT32_MAX, the same value for any real tensor; TVM's legalization of run-time-sized
  tensors builds int32 index arithmetic and rejects the int64 literal.
- Every converter's tensors of known rank but unknown shape (a dynamic strided slice, a broadcast of two
  run-time sizes, an If whose branches differ) are match-cast to fresh symbolic dims, inputs and outputs:
  relax ops infer no shape from such a tensor, so everything downstream stayed shapeless and LegalizeOps
  left those ops as they were (tvm.compile then failed in codegen: "InternalError: R.add(alloc.., alloc..)").
  The match-cast checks the rank at run time and binds the dims from the tensor itself."""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from .tvm_affine_grid import affine_grid_converter
from .tvm_assert import OP_TYPE as ASSERT
from .tvm_assert import assert_converter
from .tvm_bounds import BOUNDS as _BOUNDS
from .tvm_bounds import bound as _bound
from .tvm_bounds import upper as _upper
from .tvm_col2im import col2im_converter
from .tvm_conv_fp16 import conv_converter
from .tvm_dynamic_shapes import (
    expand_converter,
    reshape_converter,
    runtime_dims,
    runtime_tensor,
    split_converter,
    static_length,
    tile_converter,
)
from .tvm_indices import bounded, clamp, max_unpool_converter
from .tvm_nms import nms_converter
from .tvm_pad import pad_converter
from .tvm_recurrence import OP_TYPE as RECURRENCE
from .tvm_recurrence import recurrence_converter
from .tvm_reduce import CONVERTERS as REDUCE_CONVERTERS
from .tvm_reduce import squeeze_converter
from .tvm_resize import resize_converter, upsample_converter
from .tvm_slice import slice_converter
from .tvm_trilu import trilu_converter


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
            both = bb.normalize(
                relax.op.topk(data, -1, axis, ret_type="both", largest=attr.get("largest", 1), dtype="int64")
            )
            # k as a symbolic dim and the slice a strided_slice ending at it: a dynamic_strided_slice has no shape
            # (nothing downstream legalizes), and TVM's FoldConstant legalizes it, emitting its shape function's
            # call, then drops the PrimFunc. k is clamped to [0, n] first (ONNX has k <= n; onnxruntime refuses
            # more), so the slice is in bounds and its length is exactly k: with bounds checks the inferred length
            # is an if_then_else expression that FuseOps cannot type, and a match_cast of it crashes
            # CanonicalizeBindings.
            n = bb.normalize(
                relax.op.astype(
                    relax.op.take(
                        relax.op.shape_to_tensor(relax.op.shape_of(data)),
                        relax.const(np.array([axis], np.int64), "int64"),
                    ),
                    "int64",
                )
            )
            k = relax.op.reshape(relax.op.astype(k, "int64"), [1])
            k = relax.op.maximum(relax.op.minimum(k, n), relax.const(np.array([0], np.int64), "int64"))
            k = bb.normalize(relax.op.tensor_to_shape(bb.normalize(k)))
            kv = tvm.tirx.Var("topk_k", "int64")
            bb.match_cast(k, relax.ShapeType([kv]))
            if data.ty.shape is not None:
                _bound(kv, data.ty.shape.values[axis])
            outs = [
                bb.normalize(
                    relax.op.strided_slice(
                        bb.normalize(relax.TupleGetItem(both, i)), [axis], [0], [kv], assume_inbound=True
                    )
                )
                for i in range(2)
            ]
            return relax.Tuple(outs)

    return TopK


def _shape_value(x) -> bool:
    """A shape held in a variable (`shape_of` a run-time-sized tensor), not a literal ShapeExpr: what TVM's
    ConstantOfShape and Cast converters do not take."""
    from tvm import relax

    return not isinstance(x, relax.ShapeExpr) and isinstance(getattr(x, "ty", None), relax.ShapeType)


def _constant_of_shape():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class ConstantOfShape(f.ConstantOfShape):
        @classmethod
        def _impl_v9(cls, bb, inputs, attr, params):
            shape = inputs[0]
            if runtime_tensor(shape, params):  # a shape fed at run time, of static length: symbolic dims
                node = attr["tvm_custom"]["name"] or "(unnamed)"
                n = static_length(shape, "ConstantOfShape", node)
                shape = relax.ShapeExpr(runtime_dims(bb, bb.normalize(relax.op.astype(shape, "int64")), n, "full"))
            elif not _shape_value(shape):
                return super()._impl_v9(bb, inputs, attr, params)
            value = f.get_numpy(attr["value"]) if attr.get("value") is not None else np.zeros(1, np.float32)
            return relax.op.full(shape, relax.const(value.reshape(()), str(value.dtype)), str(value.dtype))

    return ConstantOfShape


def _int_bits(dtype: str) -> int | None:
    """Bit width of an integer dtype name (int8, uint32, ...), None for anything else."""
    for prefix in ("uint", "int"):
        if dtype.startswith(prefix) and dtype[len(prefix) :].isdigit():
            return int(dtype[len(prefix) :])
    return None


def _cast():
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Cast(f.Cast):
        """TVM's Cast, but float -> narrower integers wrap by truncating an int64 (or int32) value:
        the same result as TVM's floor_mod/where chain (two's complement), without int64 division in
        every epilogue it fuses into (MatMulInteger's int32 output fed it per matmul; benchmarks/history.md)."""

        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            x = inputs[0]
            if _shape_value(x):
                x = bb.normalize(relax.op.shape_to_tensor(x))
            inputs[0] = x
            to = str(f.get_type(attr["to"]))
            src = str(getattr(getattr(x, "ty", None), "dtype", ""))
            bits = _int_bits(to)
            if isinstance(x, relax.Expr) and not isinstance(x, tvm.ir.GenericConst) and src.startswith(("float", "bf")):
                if bits is not None and bits < 64:
                    finite = relax.op.where(relax.op.logical_not(relax.op.isfinite(x)), relax.const(0.0, src), x)
                    wide = relax.op.astype(bb.emit(finite), "int64" if bits >= 32 else "int32")
                    return relax.op.astype(wide, to)
            return super()._impl_v13(bb, inputs, attr, params)

    return Cast


def _roi_align():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class RoiAlign(f.RoiAlign):
        """half_pixel shifts the scaled RoI by half a pixel (onnxruntime: roi * scale - 0.5); TVM's converter
        shifted the RoI before scaling (roi - 0.5, then * scale), off by 0.5 * (1 - scale) input pixels
        wherever spatial_scale is not 1 (every FPN level). The same op, with the shift right."""

        @classmethod
        def _impl(cls, bb, inputs, attr, params, default_coordinate_transformation_mode):
            if len(inputs) > 2 and inputs[2] is not None:  # a batch index past the batch read outside the data
                inputs[2] = clamp(bb, inputs[2], f._axis_extent(bb, inputs[0], 0, inputs[2].ty.dtype.dtype))
            mode = attr.get("coordinate_transformation_mode", default_coordinate_transformation_mode)
            mode = mode.decode("ascii") if isinstance(mode, bytes) else mode
            if mode != "half_pixel" or len(inputs) != 3:
                return super()._impl(bb, inputs, attr, params, default_coordinate_transformation_mode)
            data, rois, batch = inputs[0], inputs[1], inputs[2]
            scale = float(attr.get("spatial_scale", 1.0))
            dtype = rois.ty.dtype
            shifted = relax.op.subtract(rois, relax.const(0.5 / scale, dtype))
            batch = relax.op.astype(relax.op.expand_dims(batch, axis=1), dtype)
            op_mode = attr.get("mode", b"avg")
            return relax.op.vision.roi_align(
                data,
                relax.op.concat([batch, shifted], axis=1),
                pooled_size=(attr.get("output_height", 1), attr.get("output_width", 1)),
                spatial_scale=scale,
                sample_ratio=attr.get("sampling_ratio", 0),
                aligned=True,
                layout="NCHW",
                mode=op_mode.decode("ascii") if isinstance(op_mode, bytes) else op_mode,
            )

    return RoiAlign


def _nonzero():
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class NonZero(f.NonZero):
        @classmethod
        def _impl_v9(cls, bb, inputs, attr, params):
            out = super()._impl_v9(bb, inputs, attr, params)
            ty = inputs[0].ty
            if ty.shape is not None:
                n = 1
                for d in ty.shape.values:
                    u = _upper(d)
                    n = None if n is None or u is None else n * u
                if n is not None:
                    _bound(out.ty.shape.values[-1], n)
            return out

    return NonZero


OVERRIDES = {
    "MaxUnpool": max_unpool_converter,  # indices clamped into the data (tvm_indices.py)
    "GatherElements": bounded("GatherElements", False),
    "GatherND": bounded("GatherND", True),
    "ScatterElements": bounded("ScatterElements", False),
    "ScatterND": bounded("ScatterND", True),
    "NonZero": _nonzero,
    "TopK": _topk,
    "ConstantOfShape": _constant_of_shape,
    "Cast": _cast,
    "NonMaxSuppression": nms_converter,
    "RoiAlign": _roi_align,
    "Slice": slice_converter,
    "Reshape": reshape_converter,  # run-time target shapes (tvm_dynamic_shapes.py)
    "Expand": expand_converter,
    "Split": split_converter,
    "Tile": tile_converter,
    "Squeeze": squeeze_converter,
    "Resize": resize_converter,  # roi, scales or sizes fed at run time (tvm_resize.py)
    "Upsample": upsample_converter,  # scales fed at run time (tvm_resize.py)
    "Pad": pad_converter,  # pads fed at run time (tvm_pad.py)
    "AffineGrid": affine_grid_converter,  # size fed at run time (tvm_affine_grid.py)
    "Trilu": trilu_converter,  # k fed at run time (tvm_trilu.py)
    "Conv": conv_converter,  # float16/bfloat16 accumulated in float32 (tvm_conv_fp16.py)
    "Col2Im": col2im_converter,  # image_shape/block_shape fed at run time (tvm_col2im.py; constant ones: decompose/)
    RECURRENCE: recurrence_converter,  # Kiln's own node: an LSTM/GRU/RNN layer as one kernel (tvm_recurrence.py)
    ASSERT: assert_converter,  # Kiln's own node: the check that replaces an If branch that cannot run
    **REDUCE_CONVERTERS,  # Reduce* with run-time axes (tvm_reduce.py)
}


# converters whose result is a sequence or an optional (a tuple that _construct_nodes keeps whole)
_TUPLE_RESULTS = frozenset(
    {
        "Optional",
        "OptionalGetElement",
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceErase",
        "SequenceInsert",
        "ConcatFromSequence",
        "SplitToSequence",
        "SequenceAt",
        "SequenceLength",
    }
)


def _shapeless(x) -> bool:
    from tvm import relax

    ty = getattr(x, "ty", None) if isinstance(x, relax.Expr) else None
    return isinstance(ty, relax.TensorType) and ty.shape is None and ty.ndim >= 0


class _Shaped:
    """A converter class of TVM's map whose shapeless tensors (inputs and results) get symbolic dims."""

    def __init__(self, name, cls, cache):
        self.name, self.cls, self.cache = name, cls, cache

    def __getattr__(self, attr):
        return getattr(self.cls, attr)

    def get_converter(self, opset):
        convert = self.cls.get_converter(opset)
        if self.name in _TUPLE_RESULTS:
            return convert

        def converter(bb, inputs, attr, params):
            for i, x in enumerate(inputs):  # TVM's onnx_input: edited in place
                if x is not None and _shapeless(x):
                    inputs[i] = self._cast(bb, x)
            if self.name == "Concat":
                _same_other_dims(bb, inputs, attr.get("axis", 0))
            return self._shaped(bb, convert(bb, inputs, attr, params))

        return converter

    def _cast(self, bb, x):
        import tvm
        from tvm import relax

        key = id(x)
        hit = self.cache.get(key)
        if hit is not None and hit[0].same_as(x):
            return hit[1]
        ty = x.ty
        n = len(self.cache)
        dims = [tvm.tirx.Var(f"dyn{n}_{d}", "int64") for d in range(ty.ndim)]
        for d, b in zip(dims, _branch_bounds(bb, x, ty.ndim)):
            if b is not None:
                _BOUNDS[d] = b
        cast = bb.match_cast(x, relax.TensorType(dims, ty.dtype))
        self.cache[key] = (x, cast)
        return cast

    def _shaped(self, bb, out):
        from tvm import relax

        if not isinstance(out, relax.Expr):
            return out
        if isinstance(out, relax.Tuple):
            fields = [self._shaped(bb, x) for x in out.fields]
            return out if all(a.same_as(b) for a, b in zip(fields, out.fields)) else relax.Tuple(fields)
        out = bb.normalize(out)
        if _shapeless(out):
            return self._cast(bb, out)
        if isinstance(out.ty, relax.TupleType) and any(
            isinstance(t, relax.TensorType) and t.shape is None and t.ndim >= 0 for t in out.ty.fields
        ):
            return relax.Tuple(
                [self._shaped(bb, bb.emit(relax.TupleGetItem(out, i))) for i in range(len(out.ty.fields))]
            )
        return out


def _same_other_dims(bb, inputs, axis: int) -> None:
    """Concat's inputs match-cast to the first one's dims off the axis where they differ symbolically (in
    place): ONNX requires them equal, and a run-time check says so where they are not, but relax cannot
    prove two run-time sizes equal, infers no shape for the concat, and LegalizeOps leaves it as it is
    (tvm.compile: "InternalError: R.concat(alloc.., alloc..)")."""
    from tvm import relax

    tensors = [
        (i, x)
        for i, x in enumerate(inputs)
        if isinstance(x, relax.Expr) and isinstance(x.ty, relax.TensorType) and isinstance(x.ty.shape, relax.ShapeExpr)
    ]
    if len(tensors) < 2:
        return
    ref = list(tensors[0][1].ty.shape.values)
    axis = axis % len(ref)
    for i, x in tensors[1:]:
        dims = list(x.ty.shape.values)
        if len(dims) != len(ref) or all(d == axis or _equal(dims[d], ref[d]) for d in range(len(ref))):
            continue
        want = [dims[d] if d == axis else ref[d] for d in range(len(ref))]
        inputs[i] = bb.match_cast(x, relax.TensorType(want, x.ty.dtype))


def _equal(a, b) -> bool:
    """Two dims provably equal (the same expression, or the same static size)."""
    from tvm.sym import Analyzer

    if a.same_as(b):
        return True
    try:
        return bool(Analyzer().can_prove_equal(a, b))
    except Exception:
        return False


def _dims_upper(ty, ndim: int):
    """The static upper bound of each dim of a tensor type; None unless every dim has one."""
    from tvm import relax

    if not isinstance(ty, relax.TensorType) or ty.shape is None or len(ty.shape.values) != ndim:
        return None
    out = [_upper(d) for d in ty.shape.values]
    return None if any(b is None for b in out) else out


def _branch_bounds(bb, x, ndim: int) -> list:
    """Static upper bounds of the dims of a shapeless x, from what made it: a slice (no longer than its
    input), a concat, an If (the larger of the branches' bounds per dim: torchvision's batched NMS is
    `empty if no boxes else nms(...)`); None where unknown."""
    from tvm import relax

    none = [None] * ndim
    try:
        value, index = (bb.lookup_binding(x) if isinstance(x, relax.Var) else x), None
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            value, index = bb.lookup_binding(value.tuple_value), value.index
        if isinstance(value, relax.Call) and getattr(value.op, "name", "") in (
            "relax.dynamic_strided_slice",
            "relax.strided_slice",
        ):
            return _dims_upper(value.args[0].ty, ndim) or none  # a slice is no longer than its input
        if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.concat":
            parts = [_dims_upper(t, ndim) for t in value.args[0].ty.fields]
            if any(p is None for p in parts):
                return none
            axis = int(value.attrs.axis) % ndim
            return [sum(p[d] for p in parts) if d == axis else max(p[d] for p in parts) for d in range(ndim)]
        if not isinstance(value, relax.If):
            return none
        out = []
        for branch in (value.true_branch, value.false_branch):
            ty = branch.body.ty if isinstance(branch, relax.SeqExpr) else branch.ty
            if index is not None:
                ty = ty.fields[index] if isinstance(ty, relax.TupleType) else None
            if not isinstance(ty, relax.TensorType) or ty.shape is None or len(ty.shape.values) != ndim:
                return none
            out.append([_upper(d) for d in ty.shape.values])
        return [None if a is None or b is None else max(a, b) for a, b in zip(*out)]
    except Exception:
        return none


# Kiln's imports run one at a time (TVM's map is a module global, _BOUNDS and the converters' cache are Kiln's), and
# only the importing thread sees Kiln's map: another thread calling TVM's importer meanwhile gets TVM's own.
# TVM 0.27 has no supported hook for a converter map (from_onnx takes none).
_IMPORT_LOCK = threading.RLock()


@contextlib.contextmanager
def kiln_converters():
    """TVM's converter map with Kiln's overrides, for the imports inside the block, in this thread only: the
    block holds _IMPORT_LOCK, so concurrent compiles import one after another (the rest of a compile runs
    in parallel), and TVM's map is restored when it ends."""
    from tvm.relax.frontend.onnx import onnx_frontend as f

    with _IMPORT_LOCK:
        original = f._get_convert_map
        extra = {name: make() for name, make in OVERRIDES.items()}
        cache: dict = {}
        owner = threading.get_ident()
        _BOUNDS.clear()

        def convert_map():
            if threading.get_ident() != owner:
                return original()
            return {name: _Shaped(name, cls, cache) for name, cls in {**original(), **extra}.items()}

        f._get_convert_map = convert_map
        try:
            yield
        finally:
            f._get_convert_map = original
            _BOUNDS.clear()
