"""QuantizeGraph: rewrite float layers into integer ones, given calibrated activation ranges.

  x (float) -> q = clip(round(x / s) + zp, 0, 255) as uint8      (fuses into the producer's epilogue)
  conv2d/matmul(q, Wq int8, out int32)                            (u8 x s8 -> s32, the int8 kernel)
  y = float(acc) * (s * sw) - zp * s * sw * sum(Wq)               (requantization in the epilogue)

Activations are asymmetric uint8 (zero point zp; 0 for post-ReLU tensors), weights symmetric int8
per output channel (sw = max|W| / 127; / 64 for the target's vpmaddubsw kernels, whose int16 pair
sums would saturate with 8-bit weights). A convolution whose input has zp != 0 pads explicitly with
zp, so padding stays real 0. Accumulation is exact in int32, so an int8 layer matches a numpy
reference bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import relax

from ..ir import op_name, scalar_value
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


def quantize_weight(w: np.ndarray, axis: int, qmax: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel int8 (channels on `axis`) in [-qmax, qmax]: (Wq, scale per channel).
    qmax 64 for vpmaddubsw kernels (7-bit weights: docs/int8-kernels.md)."""
    red = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w).max(axis=red) if red else np.abs(w)
    scale = np.where(amax > 0, amax / float(qmax), 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    wq = np.clip(np.round(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
    return wq, scale


def quantize_act(x, q: QParams):
    """relax ops: float x -> uint8 codes."""
    op = relax.op
    r = op.round(op.multiply(x, relax.const(np.float32(1.0 / q.scale))))
    if q.zero_point:
        r = op.add(r, relax.const(np.float32(q.zero_point)))
    return op.astype(op.clip(r, 0.0, 255.0), "uint8")


def quantize_act_chain(bindings, users: dict, start: int):
    """quantize_act's ops read back from a binding block, from the multiply at index `start`: (the chain's binding
    indices, the scale, the zero point) where multiply by a positive scalar -> round -> [+ scalar] -> clip ->
    astype(uint8) follow one another, each the one reader of the one before (users: ir.var_users), else None."""
    inv = scalar_value(bindings[start].value.args[1]) if op_name(bindings[start].value) == "relax.multiply" else None
    if inv is None or inv <= 0:
        return None
    idx, zp = [start], 0.0
    for name in ("relax.round", "relax.add", "relax.clip", "relax.astype"):
        nxt = users.get(bindings[idx[-1]].var, [])
        if len(nxt) != 1 or op_name(bindings[nxt[0]].value) != name:
            if name == "relax.add":
                continue  # no zero point
            return None
        if name == "relax.add":
            zp = scalar_value(bindings[nxt[0]].value.args[1])
            if zp is None:
                return None
        idx.append(nxt[0])
    if str(bindings[idx[-1]].value.attrs.dtype) != "uint8":
        return None
    return idx, float(np.float32(1.0) / np.float32(inv)), zp


COLUMN_BLOCK = 16  # matmul columns are padded to this: every int8 kernel's lanes (4, 8, 16) divide it
WIDE_COLUMN_BLOCK = 64  # or to this where that adds at most 1/64: 4 blocks of 16 for the register tile


def padded_columns(n: int) -> int:
    """The column count an int8 matmul's weights are padded to: ddddocr's 8210 classes to 8256 (516 = 4 x 129
    blocks of 16), not 8224 (514 = 2 x 257: a register tile of at most 2 blocks)."""
    wide = -(-n // WIDE_COLUMN_BLOCK) * WIDE_COLUMN_BLOCK
    return wide if (wide - n) * WIDE_COLUMN_BLOCK <= n else -(-n // COLUMN_BLOCK) * COLUMN_BLOCK


def integer_layer(bb, call, xq, zp, sx, wq: np.ndarray, sw: np.ndarray):
    """The integer form of a float conv2d (NCHW/OIHW) or matmul `call`, given its input as uint8
    codes `xq` (zero point zp, scale sx) and int8 weights wq with per-output-channel scales sw:
      acc = op(pad(xq, zp), wq) in int32;  y = float(acc) * sx*sw - zp * sx*sw * sum(wq)
    zp is an int, or for a matmul a uint8 scalar relax value computed at run time (onnxruntime's
    dynamic quantization). A matmul's weight columns are padded with zeros (padded_columns) and the
    result sliced back, so the int8 kernel (N % lanes == 0) takes any width.
    Emits the intermediate bindings into bb and returns y (float32), the value `call` had."""
    op = relax.op
    m = (np.float32(sx) * sw).astype(np.float32)
    if call.op.name == "relax.nn.conv2d":
        a = call.attrs
        padding = [int(p) for p in a.padding]
        if zp and any(padding):  # pad with the zero point: padding stays a real 0
            xq = bb.emit(
                op.nn.pad(xq, [0, 0, 0, 0, padding[0], padding[2], padding[1], padding[3]], pad_value=float(zp))
            )
            padding = [0, 0, 0, 0]
        acc = op.nn.conv2d(
            xq,
            relax.const(wq),
            [int(s) for s in a.strides],
            padding,
            [int(d) for d in a.dilation],
            1,
            "NCHW",
            "OIHW",
            None,
            "int32",
        )
        shape, wsum = (1, -1, 1, 1), wq.astype(np.int64).sum(axis=(1, 2, 3))
    else:
        n = wq.shape[1]
        pad = padded_columns(n) - n
        acc = op.matmul(xq, relax.const(np.pad(wq, ((0, 0), (0, pad))) if pad else wq), "int32")
        if pad:
            rank = len(call.ty.shape)
            acc = op.strided_slice(bb.emit(acc), [rank - 1], [0], [n])
        shape, wsum = (-1,), wq.astype(np.int64).sum(axis=0)
    y = op.multiply(op.astype(bb.emit(acc), "float32"), relax.const(m.reshape(shape)))
    if isinstance(zp, relax.Expr):
        corr = op.multiply(op.astype(zp, "float32"), relax.const((-m * wsum).astype(np.float32).reshape(shape)))
        y = op.add(bb.emit(y), bb.emit(corr))
    elif zp:
        y = op.add(bb.emit(y), relax.const((-zp * m * wsum).astype(np.float32).reshape(shape)))
    return y


@relax.expr_functor.mutator
class QuantizeGraph(LayerMutator):
    """ranges: layer name -> (lo, hi) of its input. Layers without a range or with a reason stay
    float. taps=True makes each int8 layer's float output an extra output (accuracy report).
    caps: the target's capabilities, which pick the int8 kernel (its channel block and weight range)."""

    def __init__(self, mod, ranges: dict, onnx_model=None, keep_float=(), taps: bool = False, caps=None):
        super().__init__(mod, onnx_model, keep_float, caps)
        self.ranges, self.tap_outputs = ranges, taps
        self.quantized: list[str] = []

    def on_layer(self, call, layer: Layer):
        if layer.reason is not None or layer.name not in self.ranges:
            return call
        q = QParams.from_range(*self.ranges[layer.name])
        w = weight_array(call).astype(np.float32)
        xq = self.builder_.emit(quantize_act(call.args[0], q))
        wq, sw = quantize_weight(w, 0 if layer.op == "conv2d" else 1, self.int8.weight_max if self.int8 else 127)
        y = integer_layer(self.builder_, call, xq, q.zero_point, np.float32(q.scale), wq, sw)
        self.quantized.append(layer.name)
        if self.tap_outputs:
            return self.emit_tap(layer.name, y)
        return y


# ops whose output's values are some of their input's (a strided shortcut's slice, a max pool): a layer reading one
# reads the same tensor as the layers reading its input, and a quantize commutes with them (HoistQuantize)
PICKING = ("relax.strided_slice", "relax.nn.max_pool2d")


@relax.expr_functor.mutator
class CalibrationTaps(LayerMutator):
    """Every layer's float input (`name`) and output (`name:out`) become extra outputs. `shared` groups the layers
    whose inputs are one tensor, or values picked from it (PICKING): shared_ranges gives them one range."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sources: dict = {}  # the tensor a layer's input is or picks from -> the layers' names

    def on_layer(self, call, layer: Layer):
        x = call.args[0]
        while isinstance(x, relax.Var) and op_name(v := self.lookup_binding(x)) in PICKING:
            x = v.args[0]
        self.sources.setdefault(x, []).append(layer.name)
        self.emit_tap(layer.name, call.args[0])
        return self.emit_tap(layer.name + ":out", call)

    @property
    def shared(self) -> list[list[str]]:
        return [names for names in self.sources.values() if len(names) > 1]


def shared_ranges(ranges: dict, shared: list[list[str]]) -> dict:
    """Layers that read one tensor (CalibrationTaps.shared) quantize it with one range, the widest: the tensor's
    producer then writes the codes once for all of them. ResNet's stage-opening block output fed its next conv and
    the strided shortcut's slice with two ranges, so its conv wrote float32 and two quantize kernels read it back
    (benchmarks/history.md)."""
    out = dict(ranges)
    for names in shared:
        got = [ranges[n] for n in names if n in ranges]
        if len(got) == len(names):
            both = (min(lo for lo, _ in got), max(hi for _, hi in got))
            out.update(dict.fromkeys(names, both))
    return out
