"""A TFLite import as Kiln's passes expect an ONNX one: NCHW/OIHW convolutions, and quantized weights
whose dequantize reads a constant directly.

TVM's TFLite importer emits NHWC/HWIO convolutions, FULLY_CONNECTED weights as
dequantize(permute_dims(W)) and conv weights as dequantize(W, axis=3). TVM's ConvertLayout puts the
convs in NCHW with permute_dims around them; this module then moves each permute_dims above a
dequantize (per-tensor scale, or a constant whose scale axis is permuted with it) and folds
permute_dims/reshape of constants. What is left is conv2d(dequantize(xq), dequantize(Wq)) as in an
ONNX QDQ model, which LowerQDQ turns into Kiln's integer convolutions and matmuls."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst


def _op(call, name: str) -> bool:
    return isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == name


def _scalar(e) -> bool:
    return isinstance(e, GenericConst) and int(np.prod(e.value.shape)) == 1


@relax.expr_functor.mutator
class _SinkPermutes(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.folded = self.moved = self.pools = 0

    def _value(self, e):
        return self.lookup_binding(e) if isinstance(e, relax.Var) else e

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if _op(call, "relax.dequantize") and isinstance(self._value(call.args[0]), GenericConst):
            data = self._value(call.args[0])  # a folded weight bound to a var: LowerQDQ reads constants only
            return relax.op.dequantize(data, *call.args[1:], axis=int(call.attrs.axis), out_dtype=call.attrs.out_dtype)
        if _op(call, "relax.astype") and str(call.attrs.dtype) in ("int8", "uint8"):
            return self._rounded_pool(call)
        if not (_op(call, "relax.permute_dims") or _op(call, "relax.reshape")):
            return call
        x = call.args[0]
        if isinstance(x, GenericConst):  # permute/reshape of a constant weight: fold it here
            self.folded += 1
            return relax.const(self._apply(call, x.value.numpy()), str(x.value.dtype))
        dq = self._value(x)
        if not _op(call, "relax.permute_dims") or not _op(dq, "relax.dequantize"):
            return call
        data, scale, zp = dq.args
        axes = [int(a) for a in call.attrs.axes] if call.attrs.axes is not None else None
        ndim = len(dq.ty.shape)
        axes = axes if axes is not None else list(range(ndim))[::-1]
        if _scalar(scale) and _scalar(zp):
            axis = 0
        elif isinstance(data, GenericConst):
            axis = axes.index(int(dq.attrs.axis) % ndim)
        else:
            return call
        moved = (
            relax.const(data.value.numpy().transpose(axes), str(data.value.dtype))
            if isinstance(data, GenericConst)
            else self.builder_.emit(relax.op.permute_dims(data, axes))
        )
        self.moved += 1
        return relax.op.dequantize(moved, scale, zp, axis=axis, out_dtype=str(dq.attrs.out_dtype))

    def _rounded_pool(self, call):
        """astype(avg_pool2d(astype(xq, int32)), int8), TVM's quantized AVERAGE_POOL_2D, truncates the mean;
        TFLite rounds it to nearest. Pool in float and round, as LiteRT does."""
        pool = self._value(call.args[0])
        inner = self._value(pool.args[0]) if _op(pool, "relax.nn.avg_pool2d") else None
        if not _op(inner, "relax.astype") or str(inner.attrs.dtype) != "int32":
            return call
        a = pool.attrs
        f = relax.op.nn.avg_pool2d(
            relax.op.astype(inner.args[0], "float32"),
            a.pool_size,
            a.strides,
            a.padding,
            a.dilation,
            a.ceil_mode,
            a.count_include_pad,
            a.layout,
            a.out_layout,
        )
        self.pools += 1
        return relax.op.astype(relax.op.round(f), str(call.attrs.dtype))

    @staticmethod
    def _apply(call, a: np.ndarray) -> np.ndarray:
        if _op(call, "relax.permute_dims"):
            axes = call.attrs.axes
            return np.ascontiguousarray(a.transpose([int(i) for i in axes]) if axes is not None else a.T)
        return np.ascontiguousarray(a.reshape([int(d) for d in call.ty.shape]))


def normalize(mod: tvm.IRModule) -> tuple[tvm.IRModule, dict]:
    """(module with NCHW convolutions and constant-fed dequantizes, stats)."""
    convs = sum(1 for b in _bindings(mod) if _op(b.value, "relax.nn.conv2d") and b.value.attrs.data_layout != "NCHW")
    if convs:
        mod = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NCHW", "OIHW"]})(mod)
    sink = _SinkPermutes(mod)
    mod["main"] = sink.visit_expr(mod["main"])
    mod = relax.transform.DeadCodeElimination(["main"])(relax.transform.Normalize()(mod))
    return mod, {
        "tflite_nhwc_convs": convs,
        "tflite_permutes_folded": sink.folded,
        "tflite_dequantize_moved": sink.moved,
        "tflite_pools_rounded": sink.pools,
    }


def _bindings(mod):
    for block in getattr(mod["main"].body, "blocks", []):
        yield from block.bindings
