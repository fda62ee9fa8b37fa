"""Conv1dAsConv2d: run each NCW conv1d as an NCHW conv2d of height 1 (x [N, C, W] -> [N, C, 1, W],
weights [O, I, K] -> [O, I, 1, K]), so it gets what conv2d has: the channel-blocked NCHWc layout,
its register-tiled schedule and the epilogue fusion. TVM legalizes conv1d to topi's conv1d_ncw,
which no Kiln rule knows: the generic reduction rule ran the 1-D convs of speech models (keyword
spotting, VAD, wav2vec2's feature encoder, Whisper's stem) at a few percent of peak (timings in benchmarks/history.md).

The height-1 axis is dropped (squeeze) as late as it can be: elementwise ops after the conv (bias,
ReLU, a residual add of another conv's output) run on the 4-D tensor, squeeze moving past them, and
where the next conv1d re-adds the axis, `expand_dims(squeeze(y))` is just y. So a chain of 1-D
convs stays 4-D, and ConvertLayout keeps it blocked from one conv to the next instead of
transforming it around each. Only float NCW/OIW convs are rewritten whose input and output channels
both take a block of 4 or more lanes, or whose output channels are a multiple of the vector width
(they stay NCHW, output channels vectorized: conv_nchw_oc_vectorized, e.g. wav2vec2's 1 -> 512 stem).
Others would be an NCHW conv2d on the generic rule, slower than TVM's conv1d (silero's STFT conv,
1 -> 258 channels: several times the whole model's time with conv1d).
`stats["conv1d_as_conv2d"]` counts the convs.

Such an unblockable conv over few output positions (an STFT as a conv: silero's 1 -> 258 channels, kernel
256, stride 128, 4 frames; its 129-bin encoder conv) is a matmul instead: the frames gathered into
[positions, C*K] (im2col, at most IM2COL_MAX elements) times the weights as [C*K, O], which the matmul
schedules tile (TVM's conv1d ran them slowly, much of silero_vad's run).
`stats["conv1d_as_matmul"]` counts them."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import ints, op_name, out_dtype
from .convert_layout import widest_block
from .module_map import rewrite_functions
from .propagate_blocked_layout import UNARY

IM2COL_MAX = 1 << 15  # elements of the gathered frames: longer sequences stay convs
BINARY = ("relax.add", "relax.multiply", "relax.subtract", "relax.divide", "relax.maximum", "relax.minimum")


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, block: int):
        super().__init__(mod)
        self.block, self.count, self.matmuls = block, 0, 0

    def _height1(self, e):
        """y when e is bound to squeeze(y, [2]) of a 4-D y (a rewritten conv's output, or an op after it)."""
        if not isinstance(e, relax.Var):
            return None
        v = self.lookup_binding(e)
        if op_name(v) != "relax.squeeze" or v.attrs.axis is None or ints(v.attrs.axis) != [2]:
            return None
        return v.args[0] if v.args[0].ty.ndim == 4 else None

    def _squeezed(self, y4):
        return relax.op.squeeze(self.builder_.emit(y4), [2])

    def _const4(self, e):
        """A constant operand of a [N, C, W] op as the same constant for [N, C, 1, W] (None if not constant)."""
        if not isinstance(e, GenericConst) or e.ty.ndim > 3:
            return None
        a = e.value.numpy()
        return relax.const(a.reshape((1,) * (3 - a.ndim) + a.shape)[:, :, None, :])

    def _conv(self, call):
        a = call.attrs
        x, w = call.args
        if (
            a.data_layout != "NCW"
            or a.kernel_layout != "OIW"
            or a.out_layout != "NCW"
            or x.ty.dtype != "float32"
            or w.ty.dtype != "float32"
            or x.ty.ndim != 3
            or w.ty.shape is None
        ):
            return None
        o, i = int(w.ty.shape[0]), int(w.ty.shape[1])
        blocks = widest_block(o, self.block) >= 4 and widest_block(i * int(a.groups), self.block) >= 4
        if not blocks and (o % self.block or int(a.groups) != 1):  # else NCHW, output channels vectorized
            return self._as_matmul(call)
        w4 = relax.const(w.value.numpy()[:, :, None, :]) if isinstance(w, GenericConst) else relax.op.expand_dims(w, 2)
        x4 = self._height1(x)
        (pl, pr), (s,), (d,) = ints(a.padding), ints(a.strides), ints(a.dilation)
        self.count += 1
        return self._squeezed(
            relax.op.nn.conv2d(
                x4 if x4 is not None else relax.op.expand_dims(x, 2),
                w4,
                strides=(1, s),
                padding=(0, pl, 0, pr),
                dilation=(1, d),
                groups=int(a.groups),
                out_dtype=out_dtype(a),
            )
        )

    def _as_matmul(self, call):
        """conv1d(x, w) of one sample and groups 1 as im2col(x) @ w^T, or None when the frames are too many."""
        a = call.attrs
        x, w = call.args
        shape = x.ty.shape
        if (
            int(a.groups) != 1
            or not isinstance(w, GenericConst)
            or shape is None
            or any(not isinstance(v, (int, tvm.tirx.IntImm)) for v in shape)
        ):
            return None
        n, c, length = ints(shape)
        o, i, k = w.value.shape
        (pl, pr), (s,), (d,) = ints(a.padding), ints(a.strides), ints(a.dilation)
        positions = (length + pl + pr - d * (k - 1) - 1) // s + 1
        if n != 1 or i != c or positions < 1 or positions * c * k > IM2COL_MAX:
            return None
        bb = self.builder_
        xp = bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, pl, pr])) if pl or pr else x
        idx = np.array([[p * s + j * d for j in range(k)] for p in range(positions)], np.int64)
        frames = bb.emit(relax.op.take(xp, relax.const(idx), axis=2))  # [1, C, positions, K]
        frames = bb.emit(relax.op.reshape(relax.op.permute_dims(frames, [0, 2, 1, 3]), [positions, c * k]))
        wt = relax.const(np.ascontiguousarray(w.value.numpy().reshape(o, c * k).T))
        y = bb.emit(relax.op.matmul(frames, wt))  # [positions, O]
        self.matmuls += 1
        return relax.op.reshape(relax.op.permute_dims(y, [1, 0]), [1, o, positions])

    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = op_name(call)
        if name == "relax.nn.conv1d":
            new = self._conv(call)
            return call if new is None else new
        if name in UNARY and len(call.args) == 1:
            y = self._height1(call.args[0])
            return call if y is None else self._squeezed(relax.Call(call.op, [y], call.attrs))
        if name in BINARY and len(call.args) == 2:
            a, b = (self._height1(arg) for arg in call.args)
            if a is not None and b is not None and a.ty.shape is not None and b.ty.shape is not None:
                if ints(a.ty.shape) == ints(b.ty.shape):
                    return self._squeezed(relax.Call(call.op, [a, b], call.attrs))
                return call
            if a is not None and (c := self._const4(call.args[1])) is not None:
                return self._squeezed(relax.Call(call.op, [a, c], call.attrs))
            if b is not None and (c := self._const4(call.args[0])) is not None:
                return self._squeezed(relax.Call(call.op, [c, b], call.attrs))
        if name == "relax.expand_dims" and ints(call.attrs.axis) == [2]:
            y = self._height1(call.args[0])
            return call if y is None else y
        return call


# what Conv1dAsConv2d counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("conv1d_as_conv2d", int, "conv1d ops run as conv2d"),
    Counter("conv1d_as_matmul", int, "conv1d ops run as matmul"),
)


@tvm.transform.module_pass(opt_level=2, name="Conv1dAsConv2d")
class Conv1dAsConv2d:
    COUNTERS = COUNTERS

    def __init__(self, block: int = 16):
        self.block = block
        self.stats = {"conv1d_as_conv2d": 0, "conv1d_as_matmul": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        def rewrite(f):
            rw = _Rewriter(mod, self.block)
            out = rw.visit_expr(f)
            self.stats["conv1d_as_conv2d"] += rw.count
            self.stats["conv1d_as_matmul"] += rw.matmuls
            return out

        mod = rewrite_functions(mod, rewrite)
        return relax.transform.DeadCodeElimination(["main"])(mod)
