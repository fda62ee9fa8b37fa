"""Kiln's Slice converter for TVM 0.27's ONNX importer (installed by tvm_converters): bounds beyond int32
clamped, whole-axis entries dropped, and "to the end" entries of run-time-sized axes ending at the axis
itself, so the sliced tensor's shape is exact rather than bounded by INT32_MAX."""

from __future__ import annotations

import numpy as np

INT32_MAX = int(np.iinfo(np.int32).max)


def _clamped(c):
    """A constant int64 tensor with values beyond int32 clamped to +-INT32_MAX ("to the end", "no limit")."""
    from tvm import relax

    a = c.value.numpy()
    if a.dtype != np.int64 or np.abs(a).max(initial=0) <= INT32_MAX:
        return c
    return relax.const(np.clip(a, -INT32_MAX, INT32_MAX).astype(np.int64), "int64")


def slice_converter():
    import tvm
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Slice(f.Slice):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            for k in (1, 2):  # inputs is TVM's onnx_input (None past its end): edit it in place
                if isinstance(inputs[k], tvm.ir.GenericConst):
                    inputs[k] = _clamped(inputs[k])
            whole = _drop_whole_axes(inputs)
            if whole is not None:
                return whole
            _ends_at_run_time_dims(inputs)
            return super()._impl_v13(bb, inputs, attr, params)

    return Slice


def _drop_whole_axes(inputs):
    """Slice entries that keep a whole axis of a tensor (start 0, end "to the end", step 1) dropped from
    the slice, in place; the data itself when none is left (None otherwise). TVM infers such a slice of a
    run-time-sized axis S as min(INT32_MAX, S) - min(0, S), which it cannot prove equal to S: an Add of
    it with a tensor of length S broadcasts to an unknown shape, LegalizeOps leaves that add as it is,
    and tvm.compile fails in codegen ("InternalError: R.add(alloc.., alloc..)")."""
    from tvm import relax

    data = inputs[0]
    if (
        not isinstance(data, relax.Expr)
        or not isinstance(getattr(data, "ty", None), relax.TensorType)
        or data.ty.ndim < 0
    ):
        return None
    got = _slice_consts(inputs, data.ty.ndim)
    if got is None:
        return None
    starts, ends, axes, steps = got
    keep = ~((starts == 0) & (ends >= INT32_MAX) & (steps == 1))
    if keep.all():
        return None
    if not keep.any():
        return data
    while len(inputs) < 5:
        inputs.append(None)
    for k, a in zip(range(1, 5), (starts, ends, axes, steps)):
        inputs[k] = relax.const(a[keep], "int64")
    return None


def _slice_consts(inputs, ndim: int):
    """(starts, ends, axes, steps) of a Slice whose bounds are all constants, as int64 arrays; else None."""
    import tvm

    consts = [inputs[k] if k < len(inputs) else None for k in range(1, 5)]
    if not all(isinstance(c, tvm.ir.GenericConst) for c in consts[:2]) or not all(
        c is None or isinstance(c, tvm.ir.GenericConst) for c in consts[2:]
    ):
        return None
    starts, ends = (c.value.numpy().astype(np.int64).reshape(-1) for c in consts[:2])
    axes = (
        consts[2].value.numpy().astype(np.int64).reshape(-1) % max(ndim, 1)
        if consts[2] is not None
        else np.arange(len(starts))
    )
    steps = (
        consts[3].value.numpy().astype(np.int64).reshape(-1)
        if consts[3] is not None
        else np.ones(len(starts), np.int64)
    )
    if not (len(starts) == len(ends) == len(axes) == len(steps)):
        return None
    return starts, ends, axes, steps


def _ends_at_run_time_dims(inputs) -> None:
    """A "to the end" slice (end >= INT32_MAX, start 0, step > 0) of a run-time-sized axis S ends at S itself,
    in place. TVM infers its length as (min(INT32_MAX, S) - 0 + step - 1) // step, and Relax's static memory
    planner takes INT32_MAX as that dim's upper bound: FasterRCNN's box decoding (boxes[:, :, 0::2] after a
    detection-count slice) asked for a 58 TB buffer (std::bad_alloc at run time). Ends at S, the length is
    (S + step - 1) // step, planned at run time. Applied only when every other entry is provably in range
    (static dims, clamped here), since the rewritten slice is built with assume_inbound."""
    from tvm import relax, tirx

    data = inputs[0]
    ty = getattr(data, "ty", None) if isinstance(data, relax.Expr) else None
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0 or ty.shape is None:
        return
    got = _slice_consts(inputs, ty.ndim)
    if got is None:
        return
    dims = list(ty.shape)
    starts, ends, axes, steps = got
    new_starts, new_ends, changed = [], [], False
    for b, e, a, k in zip(starts, ends, axes, steps):
        d = dims[int(a)]
        if isinstance(d, tirx.IntImm):
            n = int(d)
            if k <= 0:
                return
            b = min(max(b + n if b < 0 else b, 0), n)
            e = min(max(e + n if e < 0 else e, 0), n)
            new_starts.append(int(b))
            new_ends.append(int(max(e, b)))
        elif b == 0 and e >= INT32_MAX and k > 0:
            new_starts.append(0)
            new_ends.append(d)
            changed = True
        else:
            return
    if not changed:
        return
    while len(inputs) < 5:
        inputs.append(None)
    inputs[1] = relax.const(np.asarray(new_starts, np.int64), "int64")
    inputs[2] = relax.ShapeExpr(new_ends)
    inputs[3] = relax.const(np.asarray(axes, np.int64), "int64")
    inputs[4] = relax.const(np.asarray(steps, np.int64), "int64")
