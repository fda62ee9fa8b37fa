"""RemoveZeroChannels: drop the channels that carry a constant, the ones structured pruning leaves
behind (PyTorch's `prune.ln_structured` zeroes a conv's output channels but keeps their shapes, so
the exported model costs as much as the unpruned one). Lossless; runs after FoldBatchNorm, so a
channel whose BN scale is zero already has zero weights.

A conv2d/matmul output channel whose weights are zero (ignoring inputs that are zero) is a
constant. The constant is followed through bias adds, activations and other elementwise ops,
residual adds (only if every branch is constant there), Concat (the offsets shift), depthwise convs,
pooling, mean and Resize, and a flatten. Where it reaches a conv2d (groups 1) or matmul, that
consumer's input channel goes and the constant folds into its bias: exact also for a padded conv,
whose bias then varies at the borders (a [1, O, H, W] map, computed here in float64). Every tensor
tied to the channel loses it together (compiler/channels.py), or none does: a channel that reaches a
model output or an op not listed here stays. `stats` counts channels and FLOPs removed, per layer
named as op_index in graph order (conv2d_3 is the fourth conv2d, the fourth ONNX Conv)."""

from __future__ import annotations

import math

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ..channels import ChannelTies
from ..ir import op_name, out_dtype, var_users, var_uses
from .counting import static_shape


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _prim(p) -> float:
    """A PrimValue argument (clip's bounds) as a float: its value is an IntImm/FloatImm or a Python number."""
    v = p.value
    return float(getattr(v, "value", v))


_erf = np.vectorize(math.erf, otypes=[np.float64])
UNARY = {
    "relax.nn.relu": lambda v, c: np.maximum(v, 0.0),
    "relax.nn.leakyrelu": lambda v, c: np.where(v >= 0, v, v * float(c.attrs.alpha)),
    "relax.clip": lambda v, c: np.clip(v, _prim(c.args[1]), _prim(c.args[2])),
    "relax.sigmoid": lambda v, c: _sigmoid(v),
    "relax.tanh": lambda v, c: np.tanh(v),
    "relax.nn.silu": lambda v, c: v * _sigmoid(v),
    "relax.nn.gelu": lambda v, c: 0.5 * v * (1.0 + _erf(v / math.sqrt(2.0))),
    "relax.exp": lambda v, c: np.exp(v),
    "relax.negative": lambda v, c: -v,
    "relax.abs": lambda v, c: np.abs(v),
    "relax.erf": lambda v, c: _erf(v),
}
BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": lambda a, b: np.where((a == 0) | (b == 0), 0.0, a * b),
    "relax.divide": np.divide,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
}
SPATIAL = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d", "relax.image.resize2d")


def _chan(e) -> tuple[int, int] | None:
    """(rank, channels) of a float tensor this pass follows: [N, C, H, W] or [N, C]; else None."""
    s = static_shape(e) if isinstance(e, relax.Expr) else None
    if s is None or len(s) not in (2, 4) or not str(e.ty.dtype).startswith(("float", "bfloat")):
        return None
    return len(s), s[1]


def _aligned(shape, rank: int) -> tuple:
    return (1,) * (rank - len(shape)) + tuple(shape)


def _const_channels(a: np.ndarray, rank: int, c: int) -> np.ndarray | None:
    """A constant operand's value per output channel (NaN where it varies over the other axes);
    None when its channel extent is neither 1 nor c."""
    s = _aligned(a.shape, rank)
    if len(s) != rank or s[1] not in (1, c):
        return None
    rows = np.moveaxis(a.reshape(s), 1, 0).reshape(s[1], -1).astype(np.float64)
    v = np.where((rows == rows[:, :1]).all(axis=1), rows[:, 0], np.nan) if rows.shape[1] else np.zeros(s[1])
    return np.broadcast_to(v, (c,)).copy()


def _conv_flops(x_shape, w_shape, out_shape) -> int:
    return 2 * out_shape[0] * math.prod(w_shape) * math.prod(out_shape[2:])


class _Analysis:
    """The constant value of every channel (NaN: not constant) and the channel ties of a function."""

    def __init__(self, func: relax.Function):
        self.ties, self.val = ChannelTies(), {}
        self.layers: dict = {}  # conv2d/matmul var -> layer name
        self.binding = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
        uses = var_uses(func)
        for p in func.params:
            self._opaque(p)
        counts: dict = {}
        for v, e in self.binding.items():
            name = op_name(e)
            if name in ("relax.nn.conv2d", "relax.matmul"):
                kind = name.removeprefix("relax.nn.").removeprefix("relax.")
                self.layers[v] = f"{kind}_{counts.setdefault(kind, 0)}"
                counts[kind] += 1
            if _chan(v) is None or not self._visit(v, e, name):
                self._block_refs(e)
                self._opaque(v)
        self._block_refs(func.body.body)
        self._dead(func, uses)
        self.merge_into = {}  # conv/matmul var -> the bias add its input-channel constants fold into
        for v, e in self.binding.items():
            if op_name(e) == "relax.add":
                a, b = e.args
                for x, c in ((a, b), (b, a)):
                    if x in self.layers and uses.get(x) == 1 and isinstance(c, GenericConst):
                        self.merge_into[x] = v

    def value(self, x) -> np.ndarray:
        return self.val[x]

    def _dead(self, func: relax.Function, uses: dict) -> None:
        """Channels nothing reads may go too: a conv/matmul input channel whose weights are all zero
        (pruned along the input axis), a channel multiplied by zero (a BatchNorm with zero scale), and,
        backwards through elementwise ops, what feeds only such channels. Each must be ignored by
        every one of its tensor's uses; a model output or an op not listed here keeps it."""
        bindings = [b for blk in func.body.blocks for b in blk.bindings]
        readers = var_users(bindings)
        dead: dict = {}
        for x in reversed(list(self.binding)):
            us = [bindings[i] for i in readers.get(x, [])]
            reads = sum(a.same_as(x) for b in us for a in b.value.args)  # x * x reads x twice
            if x not in self.ties.ok or not us or reads != uses.get(x, 0):
                continue
            d = np.ones(self.ties.channels(x), bool)
            for b in us:
                d &= self._ignored(x, b.var, b.value, dead)
            if d.any():
                dead[x] = d
                self.ties.ok[x] |= d

    def _ignored(self, x, u, e, dead: dict) -> np.ndarray:
        """The channels of x that use u = e(..., x, ...) does not read."""
        c, name, none = self.ties.channels(x), op_name(e), np.zeros(self.ties.channels(x), bool)
        if u not in self.ties.ok or not e.args[0].same_as(x) and name not in BINARY:
            return none
        w = e.args[1].value.numpy() if len(e.args) > 1 and isinstance(e.args[1], GenericConst) else None
        if name == "relax.nn.conv2d" and u in self.layers and w is not None and int(e.attrs.groups) == 1:
            return (w == 0).all(axis=(0, 2, 3)) if w.shape[1] == c else none
        if name == "relax.matmul" and u in self.layers and w is not None and w.ndim == 2:
            return (w == 0).all(axis=1) if w.shape[0] == c else none
        tied = name in UNARY or name in SPATIAL or name == "relax.mean" or name in BINARY
        if not tied or _chan(u) is None or _chan(u)[1] != c or static_shape(x) is None:
            return none
        if _aligned(static_shape(x), _chan(u)[0])[1] != c:
            return none
        return np.isfinite(self.value(u)) | dead.get(u, none)

    def _opaque(self, v) -> None:
        if _chan(v) is not None:
            self.val[v] = np.full(_chan(v)[1], np.nan)
            self.ties.add(v, np.zeros(_chan(v)[1], bool))

    def _block_refs(self, e) -> None:
        relax.analysis.post_order_visit(e, lambda x: self.ties.block(x) if isinstance(x, relax.Var) else None)

    def _known(self, x, rank: int | None = None) -> bool:
        return isinstance(x, relax.Var) and x in self.ties.ok and (rank is None or _chan(x)[0] == rank)

    def _set(self, v, val: np.ndarray) -> None:
        self.val[v] = val
        self.ties.add(v, np.isfinite(val))

    def _visit(self, v, e, name) -> bool:
        if name == "relax.nn.conv2d":
            return self._conv(v, e)
        if name == "relax.matmul":
            return self._matmul(v, e)
        if name in UNARY or name in SPATIAL or name == "relax.mean":
            return self._unary(v, e, name)
        if name in BINARY:
            return self._binary(v, e, name)
        if name == "relax.concat":
            return self._concat(v, e)
        if name == "relax.reshape":
            return self._reshape(v, e)
        return False

    def _conv(self, v, call) -> bool:
        x, w = call.args
        a = call.attrs
        if not (isinstance(w, GenericConst) and self._known(x, 4) and a.data_layout == "NCHW"):
            return False
        if a.kernel_layout != "OIHW" or str(a.out_layout) != "NCHW":
            return False
        wt, g, cin = w.value.numpy(), int(a.groups), _chan(x)[1]
        o = wt.shape[0]
        rows = wt.reshape(o, wt.shape[1], -1)
        if g == 1 and wt.shape[1] == cin:  # its input channels go by slicing W; its output is a root
            active = ~(self.value(x) == 0)
            self._set(v, np.where((rows[:, active] == 0).all(axis=(1, 2)), 0.0, np.nan))
            return True
        if g == cin and wt.shape[1] == 1 and o % cin == 0:  # depthwise: channel j reads input j // m
            m = o // cin
            xv = np.repeat(self.value(x), m)
            dead = (rows == 0).all(axis=(1, 2)) | (xv == 0)
            pad_free = all(int(p) == 0 for p in a.padding)
            with np.errstate(invalid="ignore"):
                self._set(v, np.where(dead, 0.0, xv * rows.sum(axis=(1, 2)) if pad_free else np.nan))
            self.ties.tie(x, np.arange(o) // m, v, np.arange(o))
            return True
        return False

    def _matmul(self, v, call) -> bool:
        x, w = call.args
        if not (isinstance(w, GenericConst) and self._known(x, 2) and w.value.numpy().ndim == 2):
            return False
        active = ~(self.value(x) == 0)
        self._set(v, np.where((w.value.numpy()[active] == 0).all(axis=0), 0.0, np.nan))
        return True

    def _unary(self, v, call, name) -> bool:
        x = call.args[0]
        if not self._known(x) or any(isinstance(a, relax.Var) for a in call.args[1:]):
            return False
        rank, val = _chan(x)[0], self.value(x)
        if name in SPATIAL:
            a = call.attrs
            if rank != 4 or a.layout != "NCHW" or str(getattr(a, "out_layout", "NCHW")) != "NCHW":
                return False
            padded = name == "relax.nn.avg_pool2d" and a.count_include_pad and (any(map(int, a.padding)) or a.ceil_mode)
            smooth = name == "relax.image.resize2d" and a.method not in ("nearest_neighbor", "linear")
            if padded or smooth:  # only a zero stays constant
                val = np.where(val == 0, 0.0, np.nan)
        elif name == "relax.mean":
            axes = [int(i) % rank for i in call.attrs.axis] if call.attrs.axis is not None else [0]
            if any(i < 2 for i in axes):
                return False
        else:
            with np.errstate(all="ignore"):
                val = UNARY[name](val, call)
        self._set(v, val)
        self.ties.identity(x, v)
        return True

    def _binary(self, v, call, name) -> bool:
        rank, c = _chan(v)
        vals, tied = [], []
        for arg in call.args:
            if isinstance(arg, GenericConst):
                val = _const_channels(arg.value.numpy(), rank, c)
                if val is None:
                    return False
                vals.append(val)
                continue
            s = static_shape(arg) if isinstance(arg, relax.Var) else None
            if s is None or len(s) > rank:
                return False
            if _aligned(s, rank)[1] == 1:  # broadcast along channels: not tied, not a constant
                vals.append(np.full(c, np.nan))
            elif len(s) == rank and s[1] == c and self._known(arg):
                vals.append(self.value(arg))
                tied.append(arg)
            else:
                return False
        for arg in call.args:
            if isinstance(arg, relax.Var) and arg not in tied:
                self.ties.block(arg)
        with np.errstate(all="ignore"):
            self._set(v, BINARY[name](vals[0], vals[1]))
        for arg in tied:
            self.ties.identity(arg, v)
        return True

    def _concat(self, v, call) -> bool:
        rank = _chan(v)[0]
        fields = call.args[0].fields if isinstance(call.args[0], relax.Tuple) else None
        if fields is None or int(call.attrs.axis) % rank != 1 or not all(self._known(f, rank) for f in fields):
            return False
        self._set(v, np.concatenate([self.value(f) for f in fields]))
        off = 0
        for f in fields:
            n = _chan(f)[1]
            self.ties.tie(f, np.arange(n), v, off + np.arange(n))
            off += n
        return True

    def _reshape(self, v, call) -> bool:
        x = call.args[0]
        if not self._known(x):
            return False
        s, o = static_shape(x), static_shape(v)
        if len(s) == 4 and len(o) == 2 and o[0] == s[0] and o[1] == math.prod(s[1:]):  # flatten
            hw = s[2] * s[3]
            self._set(v, np.repeat(self.value(x), hw))
            self.ties.tie(x, np.arange(o[1]) // hw, v, np.arange(o[1]))
            return True
        if (len(s), len(o)) in ((2, 4), (4, 2)) and s[:2] == o[:2] and math.prod(s) == math.prod(o):
            self._set(v, self.value(x).copy())
            self.ties.identity(x, v)
            return True
        return False


def _border_bias(w: np.ndarray, k: np.ndarray, x_shape, a, out_shape) -> np.ndarray:
    """What input channels of constant value k contribute to a conv2d's output: sum over the taps
    that fall inside the (zero-padded) input. [1, O, 1, 1] when it is the same everywhere."""
    wk = np.einsum("orhw,r->ohw", w.astype(np.float64), k)

    def valid(n_out, taps, size, stride, dil, pad):
        pos = np.arange(n_out)[:, None] * stride - pad + np.arange(taps)[None, :] * dil
        return ((pos >= 0) & (pos < size)).astype(np.float64)

    st, dl, pd = [int(i) for i in a.strides], [int(i) for i in a.dilation], [int(i) for i in a.padding]
    vh = valid(out_shape[2], w.shape[2], x_shape[2], st[0], dl[0], pd[0])
    vw = valid(out_shape[3], w.shape[3], x_shape[3], st[1], dl[1], pd[1])
    b = np.einsum("okl,hk,wl->ohw", wk, vh, vw)[None]
    return b[:, :, :1, :1] if (b == b[:, :, :1, :1]).all() else b


@relax.expr_functor.mutator
class _Shrink(relax.PyExprMutator):
    """Rebuilds every binding whose channels change: weights and constants sliced, biases folded."""

    def __init__(self, mod, an: _Analysis, keep: dict):
        super().__init__(mod)
        self.an, self.keep, self.current = an, keep, None
        self.pending: dict = {}  # conv/matmul var -> the bias its removed input channels leave (float64)
        self.layers: list[dict] = []

    def visit_var_binding_(self, binding):
        self.current = binding.var
        super().visit_var_binding_(binding)
        self.current = None

    def visit_call_(self, call):
        v = self.current
        if v is None or v not in self.an.binding or not call.same_as(self.an.binding[v]):
            return super().visit_call_(call)
        # args remapped but the call not normalized yet: its constants may still need slicing
        new = relax.Call(call.op, [self.visit_expr(a) for a in call.args], call.attrs, call.ty_args)
        name = op_name(call)
        if name == "relax.nn.conv2d" and v in self.an.layers and isinstance(call.args[1], GenericConst):
            return self._conv(v, call, new)
        if name == "relax.matmul" and v in self.an.layers and isinstance(call.args[1], GenericConst):
            return self._matmul(v, call, new)
        if name in BINARY:
            return self._binary(v, call, new)
        if name == "relax.reshape" and v in self.keep:
            return relax.op.reshape(new.args[0], (static_shape(v)[0], len(self.keep[v]), *static_shape(v)[2:]))
        return new

    def _kept(self, x, n: int) -> np.ndarray:
        return self.keep.get(x, np.arange(n))

    def _with_bias(self, v, call, bias):
        if bias is None or not np.any(bias):
            return call
        if v in self.an.merge_into:
            self.pending[v] = bias
            return call
        return relax.op.add(call, relax.const(bias.astype(str(v.ty.dtype))))

    def _record(self, v, op, c_in, c_out, before, after):
        if before != after:
            self.layers.append(
                {
                    "layer": self.an.layers[v],
                    "op": op,
                    "in": c_in,
                    "out": c_out,
                    "flops_before": before,
                    "flops_after": after,
                }
            )

    def _conv(self, v, call, new):
        x, w, a = call.args[0], call.args[1].value.numpy(), call.attrs
        if v not in self.keep and x not in self.keep:
            return new
        kin, kout = self._kept(x, _chan(x)[1]), self._kept(v, w.shape[0])
        depthwise = int(a.groups) != 1
        w2 = w[kout] if depthwise else w[kout][:, kin]
        out = relax.op.nn.conv2d(
            new.args[0],
            relax.const(w2),
            strides=[int(i) for i in a.strides],
            padding=[int(i) for i in a.padding],
            dilation=[int(i) for i in a.dilation],
            groups=len(kin) if depthwise else 1,
            data_layout="NCHW",
            kernel_layout="OIHW",
            out_layout="NCHW",
            out_dtype=out_dtype(a),
        )
        xs, vs = static_shape(x), static_shape(v)
        self._record(
            v, "depthwise" if depthwise else "conv2d", [xs[1], len(kin)], [vs[1], len(kout)],
            _conv_flops(xs, w.shape, vs), _conv_flops(xs, w2.shape, (vs[0], len(kout), *vs[2:])),
        )  # fmt: skip
        gone = np.setdiff1d(np.arange(xs[1]), kin)
        if depthwise or not len(gone):
            return out
        k = np.nan_to_num(self.an.value(x)[gone], nan=0.0)  # a dead channel (NaN) meets zero weights
        bias = _border_bias(w[kout][:, gone], k, xs, a, vs) if np.any(k) else None
        return self._with_bias(v, out, bias)

    def _matmul(self, v, call, new):
        x, w = call.args[0], call.args[1].value.numpy()
        if v not in self.keep and x not in self.keep:
            return new
        kin, kout = self._kept(x, w.shape[0]), self._kept(v, w.shape[1])
        w2 = w[kin][:, kout]
        n = static_shape(v)[0]
        self._record(v, "matmul", [w.shape[0], len(kin)], [w.shape[1], len(kout)], 2 * n * w.size, 2 * n * w2.size)
        out = relax.op.matmul(new.args[0], relax.const(w2), out_dtype=out_dtype(call.attrs))
        gone = np.setdiff1d(np.arange(w.shape[0]), kin)
        k = np.nan_to_num(self.an.value(x)[gone], nan=0.0)
        return self._with_bias(v, out, k @ w[gone][:, kout].astype(np.float64) if np.any(k) else None)

    def _binary(self, v, call, new):
        rank, c = _chan(v)
        kout = self.keep.get(v)
        args = list(new.args)
        for i, arg in enumerate(call.args):
            if not isinstance(arg, GenericConst):
                continue
            a, changed = arg.value.numpy(), False
            s = _aligned(a.shape, rank)
            if kout is not None and s[1] == c and a.ndim >= rank - 1:
                a, changed = np.take(a, kout, axis=a.ndim - rank + 1), True
            other = call.args[1 - i]
            if (
                other in self.pending
                and self.an.merge_into.get(other) is not None
                and self.an.merge_into[other].same_as(v)
            ):
                a = (a.astype(np.float64) + self.pending.pop(other)).astype(a.dtype)
                changed = True
            if changed:
                args[i] = relax.const(a)
        return relax.Call(new.op, args, new.attrs, new.ty_args) if args != list(new.args) else new


# what RemoveZeroChannels counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("zero_channel_flops_removed", int, "FLOPs of the constant channels removed", always=True),
    Counter("zero_channel_layers", list, "per layer: channels and FLOPs before and after"),
    Counter("zero_channels_removed", int, "constant channels removed", always=True),
)


@tvm.transform.module_pass(opt_level=1, name="RemoveZeroChannels")
class RemoveZeroChannels:
    COUNTERS = COUNTERS

    def __init__(self, multiple: int = 1):
        """multiple: channel counts it divides stay multiples of it (the target's NCHWc block)."""
        self.multiple = multiple
        self.stats = {"zero_channels_removed": 0, "zero_channel_flops_removed": 0, "zero_channel_layers": []}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out = None
        for gv, f in list(mod.functions.items()):
            if not isinstance(f, relax.Function) or "Primitive" in (f.attrs or {}):
                continue
            an = _Analysis(f)
            if not any(ok.any() for ok in an.ties.ok.values()):
                continue
            gone = an.ties.in_blocks(an.ties.removable(), self.multiple)
            keep = {k: np.flatnonzero(~m) for k, m in gone.items() if m.any()}
            if not keep:
                continue
            shrink = _Shrink(mod, an, keep)
            new = shrink.visit_expr(f)
            if shrink.pending:
                raise RuntimeError(f"RemoveZeroChannels: biases not folded for {sorted(map(str, shrink.pending))}")
            if not tvm_ffi.structural_equal(new.body.body.ty, f.body.body.ty):
                raise RuntimeError("RemoveZeroChannels changed the function's output type")
            out = out or tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
            out[gv] = new
            self.stats["zero_channels_removed"] += sum(l["out"][0] - l["out"][1] for l in shrink.layers)
            self.stats["zero_channel_flops_removed"] += sum(l["flops_before"] - l["flops_after"] for l in shrink.layers)
            self.stats["zero_channel_layers"] += shrink.layers
        if out is None:
            return mod
        out = relax.transform.Normalize()(out)
        relax.analysis.well_formed(out)  # raises on the first violation: the row is then skipped
        return out
