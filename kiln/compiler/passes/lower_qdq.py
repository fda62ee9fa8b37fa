"""LowerQDQ: run an already-quantized (QDQ) model's convolutions and matmuls in integers.

TVM imports ONNX QDQ models as float ops between quantize/dequantize (fake quantization). This
pass rewrites conv2d(dequantize(xq), dequantize(Wq)) and matmul(dequantize(xq), dequantize(Wq)) (or of
its transpose, a Gemm's transB) with constant, symmetric (zero point 0) int8 weights (or, for matmuls,
uint8 weights with any zero point, as w - 128 and a per-row correction) into uint8 x int8 -> int32 ops and a float
epilogue:  y = float(acc) * sx*sw - zx*sx*sw*sum(Wq)  (the same form as Kiln's own quantizer, so
the same int8 kernels run; a target whose int8 kernel would not be faster or exact keeps the layer
float). int8 activations are shifted to uint8 (+128, zero point +128); a
convolution over an input with a nonzero zero point pads with it explicitly. A matmul's uint8
activation zero point may be a run-time scalar (MatMulInteger after DynamicQuantizeLinear, from
onnxruntime's quantize_dynamic): its correction -zx*sw*sum(Wq) is then computed at run time."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ...schedules.rules.int8 import qdq_float_reason
from ..quantize.rewrite import integer_layer
from .module_map import rewrite_functions


def _const(e) -> np.ndarray | None:
    return e.value.numpy() if isinstance(e, GenericConst) else None


def _runtime_scalar(e) -> bool:
    """A one-element uint8 value that is not a constant (DynamicQuantizeLinear's zero point)."""
    ty = getattr(e, "ty", None)
    shape = getattr(ty, "shape", None)
    if _const(e) is not None or shape is None or str(getattr(ty, "dtype", "")) != "uint8":
        return False
    dims = [getattr(d, "value", None) for d in shape]
    return all(d == 1 for d in dims)


@relax.expr_functor.mutator
class _Lower(relax.PyExprMutator):
    def __init__(self, mod, caps=None):
        super().__init__(mod)
        self.caps = caps
        self.lowered = self.kept_float = 0

    def _dequantize(self, e):
        v = self.lookup_binding(e) if isinstance(e, relax.Var) else e
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.dequantize":
            return v
        return None

    def _transposed_dequantize(self, e):
        """dequantize(Wq) under a 2-D transpose (Gemm's transB: matmul(x, permute_dims(DQ(W[N, K])))), or None."""
        v = self.lookup_binding(e) if isinstance(e, relax.Var) else None
        if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.permute_dims"):
            return None
        axes = v.attrs.axes
        if axes is not None and [int(a) for a in axes] != [1, 0]:
            return None
        dw = self._dequantize(v.args[0])
        return dw if dw is not None and len(dw.ty.shape) == 2 else None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in ("relax.nn.conv2d", "relax.matmul"):
            return call
        dx, dw = self._dequantize(call.args[0]), self._dequantize(call.args[1])
        transposed = dw is None and call.op.name == "relax.matmul"
        if transposed:
            dw = self._transposed_dequantize(call.args[1])
        if dx is None or dw is None:
            return call
        sx, zx, wq, sw, zw = (
            _const(dx.args[1]),
            _const(dx.args[2]),
            _const(dw.args[0]),
            _const(dw.args[1]),
            _const(dw.args[2]),
        )
        xdt = str(dx.args[0].ty.dtype)
        conv = call.op.name == "relax.nn.conv2d"
        w_axis = int(dw.attrs.axis) % max(wq.ndim, 1) if wq is not None else 0  # the axis of its per-channel scales
        if transposed and wq is not None:
            wq, w_axis = np.ascontiguousarray(wq.T), 1 - w_axis
        if zx is None and not conv and xdt == "uint8" and _runtime_scalar(dx.args[2]):
            zx = dx.args[2]  # onnxruntime's dynamic quantization: the zero point is computed at run time
        shift = None  # uint8 matmul weights: w - zw = (w - 128) + (128 - zw), the second a multiple of sum(x - zx)
        if not conv and wq is not None and wq.dtype == np.uint8 and zw is not None and wq.ndim == 2:
            shift = (128 - np.broadcast_to(zw.reshape(-1).astype(np.int64), (wq.shape[1],))).astype(np.float32)
            wq, zw = (wq.astype(np.int16) - 128).astype(np.int8), np.zeros(1, np.int8)
        if (
            any(a is None for a in (sx, zx, wq, sw, zw))
            or sx.size != 1
            or (not isinstance(zx, relax.Expr) and zx.size != 1)
            or wq.dtype != np.int8
            or np.any(zw != 0)
            or xdt not in ("uint8", "int8")
        ):
            return call
        if conv and (
            int(call.attrs.groups) != 1 or call.attrs.data_layout != "NCHW" or call.attrs.kernel_layout != "OIHW"
        ):
            return call
        if not conv and wq.ndim != 2:
            return call
        axis = 0 if conv else 1
        if sw.size != 1 and w_axis != axis:
            return call
        if qdq_float_reason(self.caps, wq, 1 if conv else 0) is not None:
            self.kept_float += 1  # the fake-quantized float layer: as exact, and faster on this target
            return call
        xq = dx.args[0]
        zp = zx if isinstance(zx, relax.Expr) else int(zx.reshape(-1)[0])
        if xdt == "int8":  # VNNI takes unsigned activations: shift by 128
            op = relax.op
            xq = self.builder_.emit(op.astype(op.add(op.astype(xq, "int32"), relax.const(np.int32(128))), "uint8"))
            zp += 128
        sw = np.broadcast_to(sw.reshape(-1).astype(np.float32), (wq.shape[axis],))
        y = integer_layer(self.builder_, call, xq, zp, np.float32(sx.reshape(-1)[0]), wq, sw)
        if shift is not None and np.any(shift):
            y = _add_weight_zero_point(self.builder_, y, xq, zp, np.float32(sx.reshape(-1)[0]) * sw * shift)
        self.lowered += 1
        return y


def _add_weight_zero_point(bb, y, xq, zp, m: np.ndarray):
    """y + m * sum_k(xq - zp) per row: the (128 - zw) part of a uint8 weight's zero point (m = sx * sw * (128 - zw)
    per column), after the int8 kernel took w - 128 (onnxruntime's older quantize_dynamic writes uint8 weights)."""
    op = relax.op
    k = int(xq.ty.shape[-1])
    rows = bb.emit(op.sum(op.astype(xq, "float32"), axis=[-1], keepdims=True))
    if isinstance(zp, relax.Expr):
        rows = bb.emit(op.subtract(rows, op.multiply(op.astype(zp, "float32"), relax.const(np.float32(k)))))
    elif zp:
        rows = bb.emit(op.subtract(rows, relax.const(np.float32(k * zp))))
    return op.add(bb.emit(y), bb.emit(op.multiply(rows, relax.const(m.astype(np.float32)))))


# what LowerQDQ counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("qdq_kept_float", int, "QDQ patterns left in float"),
    Counter("qdq_lowered", int, "QDQ patterns lowered to integer kernels", always=True),
)


@tvm.transform.module_pass(opt_level=1, name="LowerQDQ")
class LowerQDQ:
    """caps: the target's capabilities; layers its int8 kernel would not run faster than float32 (or
    not exactly: schedules/int8.qdq_float_reason) stay fake-quantized float, counted in qdq_kept_float."""

    COUNTERS = COUNTERS

    def __init__(self, caps=None):
        self.caps = caps
        self.stats = {"qdq_lowered": 0, "qdq_kept_float": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        lower = _Lower(mod, self.caps)
        out = rewrite_functions(mod, lower.visit_expr)
        self.stats["qdq_lowered"] += lower.lowered
        self.stats["qdq_kept_float"] += lower.kept_float
        return relax.transform.DeadCodeElimination(["main"])(out) if lower.lowered else out
