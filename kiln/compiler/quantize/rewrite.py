"""QuantizeGraph: rewrite float layers into integer ones, given calibrated activation ranges.

  x (float) -> q = clip(round(x / s) + zp, 0, 255) as uint8      (fuses into the producer's epilogue)
  conv2d/matmul(q, Wq int8, out int32)                            (VNNI: u8 x s8 -> s32)
  y = float(acc) * (s * sw) - zp * s * sw * sum(Wq)               (requantization in the epilogue)

Activations are asymmetric uint8 (zero point zp; 0 for post-ReLU tensors), weights symmetric int8
per output channel (sw = max|W| / 127). A convolution whose input has zp != 0 pads explicitly with
zp, so padding stays real 0. Accumulation is exact in int32, so an int8 layer matches a numpy
reference bit for bit."""
from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax

from .layers import Layer, LayerMutator, weight_array


@dataclasses.dataclass(frozen=True)
class QParams:
    scale: float
    zero_point: int

    @staticmethod
    def from_range(lo: float, hi: float) -> QParams:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = (hi - lo) / 255.0 if hi > lo else 1.0
        return QParams(float(np.float32(scale)), int(np.clip(round(-lo / scale), 0, 255)))


def quantize_weight(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel int8 (channels on `axis`): (Wq, scale per channel)."""
    red = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w).max(axis=red) if red else np.abs(w)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    wq = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return wq, scale


def quantize_act(x, q: QParams):
    """relax ops: float x -> uint8 codes."""
    op = relax.op
    r = op.round(op.multiply(x, relax.const(np.float32(1.0 / q.scale))))
    if q.zero_point:
        r = op.add(r, relax.const(np.float32(q.zero_point)))
    return op.astype(op.clip(r, 0.0, 255.0), "uint8")


@relax.expr_functor.mutator
class QuantizeGraph(LayerMutator):
    """ranges: layer name -> (lo, hi) of its input. Layers without a range or with a reason stay
    float. taps=True makes each int8 layer's float output an extra output (accuracy report)."""

    def __init__(self, mod, ranges: dict, onnx_model=None, keep_float=(), taps: bool = False):
        super().__init__(mod, onnx_model, keep_float)
        self.ranges, self.tap_outputs = ranges, taps
        self.quantized: list[str] = []

    def on_layer(self, call, layer: Layer):
        if layer.reason is not None or layer.name not in self.ranges:
            return call
        q = QParams.from_range(*self.ranges[layer.name])
        bb = self.builder_
        w = weight_array(call).astype(np.float32)
        xq = bb.emit(quantize_act(call.args[0], q))
        if layer.op == "conv2d":
            a = call.attrs
            wq, sw = quantize_weight(w, 0)
            padding = [int(p) for p in a.padding]
            if q.zero_point and any(padding):
                xq = bb.emit(relax.op.nn.pad(xq, [0, 0, 0, 0, padding[0], padding[2], padding[1], padding[3]], pad_value=float(q.zero_point)))
                padding = [0, 0, 0, 0]
            acc = relax.op.nn.conv2d(xq, relax.const(wq), [int(s) for s in a.strides], padding, [int(d) for d in a.dilation],
                                     1, "NCHW", "OIHW", None, "int32")
            chan_shape, wsum = (1, -1, 1, 1), wq.astype(np.int64).sum(axis=(1, 2, 3))
        else:
            wq, sw = quantize_weight(w, 1)
            acc = relax.op.matmul(xq, relax.const(wq), "int32")
            chan_shape, wsum = (-1,), wq.astype(np.int64).sum(axis=0)
        m = (np.float32(q.scale) * sw).astype(np.float32)
        y = relax.op.multiply(relax.op.astype(bb.emit(acc), "float32"), relax.const(m.reshape(chan_shape)))
        if q.zero_point:
            y = relax.op.add(bb.emit(y), relax.const((-q.zero_point * m * wsum).astype(np.float32).reshape(chan_shape)))
        self.quantized.append(layer.name)
        if self.tap_outputs:
            return self.emit_tap(layer.name, y)
        return y


@relax.expr_functor.mutator
class CalibrationTaps(LayerMutator):
    """Every layer's float input (`name`) and output (`name:out`) become extra outputs."""

    def on_layer(self, call, layer: Layer):
        self.emit_tap(layer.name, call.args[0])
        return self.emit_tap(layer.name + ":out", call)
