"""PropagateBlockedLayout: after ConvertLayout, move NCHW{c}c -> NCHW transforms downstream
through what TVM's ConvertLayout leaves in NCHW, until they meet the NCHW -> NCHW{c}c transform
of the next blocked conv and both cancel.

TVM's ConvertLayout keeps depthwise convolutions in NCHW (their [C, 1, KH, KW] weight cannot take
the OIHW{c}i{c}o layout), so every MobileNet block pays two layout transforms and runs its
depthwise conv, bias and clip on an unblocked tensor. Rules, applied to a call whose input is
`unblock(x)` (a transform from NCHW{c}c to NCHW, for any block c: NarrowBlockLayout's 8c too):
  - elementwise unary op f (clip, relu, ...):        f(unblock(x))        -> unblock(f(x))
    (also quantize/dequantize with per-tensor scale and zero point: a QDQ model's float depthwise convs)
  - a binary elementwise op (add, multiply, subtract, divide, maximum, minimum) or where() with a scalar or
    per-channel operand, constant or computed:          unblock(x) / b       -> unblock(x / block(b))
    (HardSwish is x * clip(x + 3, 0, 6) / 6: without the divide a MobileNetV3 block went back to NCHW;
    a dynamically quantized conv adds a bias computed from the run-time scale)
  - the same ops on unblocked tensors of one block, also broadcast over N/H/W (the SE block's
    [1, C, 1, 1] scale times its [1, C, H, W] input): unblock(x) * unblock(y) -> unblock(x * y)
  - a max, min, sum or mean over all axes:            max(unblock(x)) -> max(x)
    (a dynamic quantization's range: without it every DynamicQuantizeLinear went back to NCHW)
  - a mean over H and W that keeps them (GlobalAveragePool): mean(unblock(x)) -> unblock(mean_c(x))
  - depthwise conv2d (groups = channels, constant weight): conv(unblock(x), w) -> unblock(conv_c(x, block(w)))
  - spatial constant pad:                              pad(unblock(x))      -> unblock(pad_c(x))
  - max/avg pool2d:                                    pool(unblock(x))     -> unblock(pool_c(x))
  - a slice of whole blocks of channels (or of N/H/W): slice(unblock(x))   -> unblock(slice_c(x))
    (TVM's ConvertLayout slices NCHW: a C2f block written with Slice instead of Split)
  - concat of unblocked tensors of one block:          concat(unblock(x), unblock(y)) -> unblock(concat(x, y))
  - a channel shuffle (reshape, transpose, reshape):   shuffle(unblock(x)) -> unblock(shuffle_c(x))
  - block(unblock(x)) -> x
The unblocked values no one uses any more are removed, and transforms of one tensor that
ConvertLayout repeats per consumer are merged (common subexpressions). `stats["transforms_moved"]`
counts the rewrites."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..ir import op_name
from .counting import bound_call, static_shape
from .module_map import rewrite_functions
from .narrow_block_layout import blocked_conv2d, unblock_map

UNARY = (
    "relax.clip",
    "relax.nn.relu",
    "relax.sigmoid",
    "relax.nn.silu",
    "relax.tanh",
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.erf",  # GELU as TorchScript exports it before opset 20: x * 0.5 * (1 + erf(x / sqrt(2)))
    "relax.exp",
    "relax.negative",
    "relax.abs",
    "relax.sqrt",
    "relax.astype",
    "relax.round",
    "relax.floor",
    "relax.ceil",
    # a dynamically quantized conv's int32 round trip: where(logical_not(isfinite(y)), 0, y)
    "relax.isfinite",
    "relax.logical_not",
)
BINARY = ("relax.add", "relax.multiply", "relax.subtract", "relax.divide", "relax.maximum", "relax.minimum")
ELEMENTWISE = (*BINARY, "relax.where")
# reductions to one value (a dynamic quantization's range; a whole-tensor mean): any layout gives the same value
REDUCE = {"relax.max": relax.op.max, "relax.min": relax.op.min, "relax.sum": relax.op.sum, "relax.mean": relax.op.mean}
POOL = {"relax.nn.max_pool2d": relax.op.nn.max_pool2d, "relax.nn.avg_pool2d": relax.op.nn.avg_pool2d}
QDQ = ("relax.quantize", "relax.dequantize")  # elementwise where scale and zero point are per-tensor scalars


def _identity(axes) -> bool:
    return axes is not None and [int(a) for a in axes] == list(range(len(axes)))


def _scalar(e) -> bool:
    """One value (a constant or one computed at run time: a dynamic quantization's scale)."""
    shape = static_shape(e)
    return shape is not None and len(shape) <= 4 and int(np.prod(shape, dtype=np.int64)) == 1


@relax.expr_functor.mutator
class _Propagate(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.moved = 0

    def _unblocked_source(self, e):
        """x when e is bound to unblock(x) (5-D NCHW{c}c -> 4-D NCHW, any c), else None."""
        if not isinstance(e, relax.Var):
            return None
        v = self.lookup_binding(e)
        if op_name(v) != "relax.layout_transform":
            return None
        src, dst = static_shape(v.args[0]), static_shape(v)
        if src is None or dst is None or len(src) != 5 or dst != (src[0], src[1] * src[4], src[2], src[3]):
            return None
        return v.args[0]

    def _unblock(self, x_c):
        self.moved += 1
        v = self.builder_.emit(x_c)
        return relax.op.layout_transform(v, index_map=unblock_map(static_shape(v)[4]))

    def _blocked_operand(self, e, channels: int, c: int):
        """A scalar as it is, or a per-channel ([1, C, 1, 1] / [C, 1, 1]) value in the blocked layout: a constant
        relaid, a value computed at run time (a dynamic quantization's bias) reshaped; else None."""
        if _scalar(e):
            return e
        if static_shape(e) not in ((1, channels, 1, 1), (channels, 1, 1)):
            return None
        if isinstance(e, GenericConst):
            a = e.value.numpy()
            return relax.const(np.ascontiguousarray(a.reshape(1, channels // c, 1, 1, c)), str(a.dtype))
        return self.builder_.emit(relax.op.reshape(e, [1, channels // c, 1, 1, c]))  # channel-major: the same order

    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = op_name(call)
        if name is None or not call.args:
            return call
        if name == "relax.layout_transform":  # block(unblock(x)) -> x
            x = self._unblocked_source(call.args[0])
            out = static_shape(call)
            if x is not None and out is not None and out == static_shape(x):
                self.moved += 1
                return x
            return call
        if name == "relax.concat":
            return self._concat(call)
        if name == "relax.reshape":
            return self._shuffle(call)
        if name == "relax.permute_dims" and _identity(call.attrs.axes):
            return call.args[0]  # ConvertLayout puts one of no axes after a reduction to one value
        if name in ELEMENTWISE and len(call.args) == (3 if name == "relax.where" else 2):
            return self._elementwise(call)
        x = self._unblocked_source(call.args[0])
        if x is None:
            return call
        channels, c = static_shape(call.args[0])[1], static_shape(x)[4]
        if name in UNARY or (name in QDQ and all(_scalar(a) for a in call.args[1:3])):
            return self._unblock(relax.Call(call.op, [x, *call.args[1:]], call.attrs))
        if name in REDUCE and self._reduces_all(call):
            self.moved += 1
            return REDUCE[name](x, axis=None, keepdims=False)
        if name == "relax.mean":
            return self._mean(call, x)
        if name == "relax.nn.conv2d":
            return self._depthwise(call, x, channels, c)
        if name == "relax.nn.pad":
            return self._pad(call, x)
        if name in POOL:
            return self._pool(call, x, c)
        if name == "relax.strided_slice":
            return self._slice(call, x, channels, c)
        return call

    def _elementwise(self, call):
        """A binary op or where() whose operands are unblocked tensors of one channel count and block (the other
        axes may broadcast), scalars, or per-channel values; at least one unblocked."""
        xs = [self._unblocked_source(a) for a in call.args]
        blocked = [static_shape(x) for x in xs if x is not None]
        if not blocked:
            return call
        channels, c = blocked[0][1] * blocked[0][4], blocked[0][4]
        if any(s[1] * s[4] != channels or s[4] != c for s in blocked):
            return call
        if any(a != b and 1 not in (a, b) for s in blocked for a, b in zip(s, blocked[0])):
            return call
        args = [x if x is not None else self._blocked_operand(a, channels, c) for x, a in zip(xs, call.args)]
        if any(a is None for a in args):
            return call
        return self._unblock(relax.Call(call.op, args, call.attrs))

    @staticmethod
    def _reduces_all(call) -> bool:
        """A reduction to one value (a dynamic quantization's min and max): any layout gives the same result."""
        axes = call.attrs.axis
        return not call.attrs.keepdims and (axes is None or sorted(int(a) % 4 for a in axes) == [0, 1, 2, 3])

    def _mean(self, call, x):
        """A mean over H and W with keepdims (GlobalAveragePool), in the blocked layout."""
        axes = call.attrs.axis
        if axes is None or not call.attrs.keepdims or sorted(int(a) % 4 for a in axes) != [2, 3]:
            return call
        return self._unblock(relax.op.mean(x, axis=[2, 3], keepdims=True))

    def _concat(self, call):
        """concat(unblock(x), unblock(y), ...) -> unblock(concat(x, y, ...)) when all share one block."""
        t = call.args[0]
        if isinstance(t, relax.Var):
            t = self.lookup_binding(t)
        if not isinstance(t, relax.Tuple) or not t.fields:
            return call
        xs = [self._unblocked_source(f) for f in t.fields]
        if any(x is None for x in xs) or len({static_shape(x)[4] for x in xs}) != 1:
            return call
        axis = int(call.attrs.axis) % 4
        return self._unblock(relax.op.concat(xs, axis=axis))

    def _shuffle(self, call):
        """ShuffleNet's channel shuffle, reshape([N, g, C/g, H, W]) -> transpose(0, 2, 1, 3, 4) -> reshape([N, C,
        H, W]), of unblock(x), in the blocked layout: out channel i * g + j is in channel j * C/g + i, which in
        NCHW{c}c (c a multiple of g, C/g of c) is one transpose of x viewed as [N, g, C/g/c, H, W, g, c/g]. Left in
        NCHW, every unit of the network went out of its block and back (ShuffleNetV2: 13 transforms)."""
        t = bound_call(call.args[0], self.lookup_binding, "relax.permute_dims")
        r = bound_call(t.args[0], self.lookup_binding, "relax.reshape") if t is not None else None
        x = self._unblocked_source(r.args[0]) if r is not None else None
        if x is None or t.attrs.axes is None or [int(a) for a in t.attrs.axes] != [0, 2, 1, 3, 4]:
            return call
        (n, channels, h, w), c = static_shape(r.args[0]), static_shape(x)[4]
        grouped, out = static_shape(r), static_shape(call)
        if grouped is None or len(grouped) != 5 or out != (n, channels, h, w):
            return call
        g, k = grouped[1], grouped[2]
        if grouped != (n, g, k, h, w) or c % g or k % c:
            return call
        view = self.builder_.emit(relax.op.reshape(x, [n, g, k // c, h, w, g, c // g]))
        moved = self.builder_.emit(relax.op.permute_dims(view, [0, 2, 5, 3, 4, 6, 1]))
        return self._unblock(relax.op.reshape(moved, [n, channels // c, h, w, c]))

    def _slice(self, call, x, channels: int, c: int):
        """A strided_slice whose channel range is whole blocks (stride 1), in the blocked layout; the
        other axes keep their positions (N, C/c, H, W, c)."""

        def ints(t):
            return [int(f.value) for f in t.fields] if isinstance(t, relax.Tuple) else None

        axes, begin, end = (ints(t) for t in call.args[1:4])
        strides = ints(call.args[4]) if len(call.args) > 4 else [1] * len(axes or [])
        if axes is None or begin is None or end is None or strides is None:
            return call
        axes = [a % 4 for a in axes]
        for i, ax in enumerate(axes):
            if ax != 1:
                continue
            b, e = (min(max(v + channels if v < 0 else v, 0), channels) for v in (begin[i], end[i]))
            if strides[i] != 1 or b % c or e % c:
                return call
            begin[i], end[i] = b // c, e // c
        out = static_shape(call)
        new = relax.op.strided_slice(x, axes, begin, end, strides, assume_inbound=bool(call.attrs.assume_inbound))
        new = self.builder_.normalize(new)
        if out is None or static_shape(new) != (out[0], out[1] // c, out[2], out[3], c):
            return call
        return self._unblock(new)

    def _pad(self, call, x):
        """Spatial constant padding (an int8 input's zero-point padding) in the blocked layout."""
        w = [int(v) for v in call.attrs.pad_width]
        if len(w) != 8 or any(w[:4]) or str(call.attrs.pad_mode) != "constant":
            return call
        return self._unblock(relax.op.nn.pad(x, w + [0, 0], pad_value=float(call.attrs.pad_value)))

    def _pool(self, call, x, c: int):
        """max/avg pooling of an NCHW tensor, in the blocked layout (a QDQ ResNet's pool between the int8 stem
        and layer1: left NCHW, it kept layer1's residual stream unblocked)."""
        a = call.attrs
        if str(a.layout) != "NCHW" or str(a.out_layout) != "NCHW":
            return call
        ints = lambda t: [int(v) for v in t]
        pool = POOL[op_name(call)](
            x,
            pool_size=ints(a.pool_size),
            strides=ints(a.strides),
            padding=ints(a.padding),
            dilation=ints(a.dilation),
            ceil_mode=bool(a.ceil_mode),
            count_include_pad=bool(a.count_include_pad),
            layout=f"NCHW{c}c",
            out_layout=f"NCHW{c}c",
        )
        return self._unblock(pool)

    def _depthwise(self, call, x, channels: int, c: int):
        a = call.attrs
        w = call.args[1]
        if int(a.groups) != channels or str(a.data_layout) != "NCHW" or not isinstance(w, GenericConst):
            return call
        wa = w.value.numpy()
        if wa.shape[:2] != (channels, 1) or static_shape(call)[1] != channels:
            return call  # a channel multiplier other than 1
        kh, kw = wa.shape[2:]
        w_c = wa.reshape(channels // c, c, kh, kw).transpose(0, 2, 3, 1).reshape(channels // c, 1, kh, kw, 1, c)
        return self._unblock(blocked_conv2d(a, x, w_c, c, c, groups=channels, kernel_layout=f"OIHW1i{c}o"))


# what PropagateBlockedLayout counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("transforms_moved", int, "layout transforms moved across elementwise ops"),)


@tvm.transform.module_pass(opt_level=2, name="PropagateBlockedLayout")
class PropagateBlockedLayout:
    COUNTERS = COUNTERS

    def __init__(self, layout: str):
        self.layout = layout
        self.stats = {"transforms_moved": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        if self.layout != "NCHWc":
            return mod
        m = _Propagate(mod)
        mod = rewrite_functions(mod, m.visit_expr)
        self.stats["transforms_moved"] = m.moved
        mod = relax.transform.EliminateCommonSubexpr()(mod)  # ConvertLayout blocks a tensor once per consumer
        return relax.transform.DeadCodeElimination(["main"])(mod)


__all__ = ["PropagateBlockedLayout"]
