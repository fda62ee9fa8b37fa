"""FoldBatchNorm: fold an inference BatchNorm into the conv2d / conv2d_transpose / matmul that
feeds it (also when a constant bias add sits between them). The producer's weights are scaled
per output channel and one bias add remains:  BN(P(x, W) + b) = P(x, W * s) + ((b - mean) * s + beta)
with s = gamma / sqrt(var + eps). New weights are computed here, in float64, at compile time.
A BatchNorm with no producer to fold into (after an activation, on an input) becomes x * s + t, the
same constants: later passes see a per-channel affine, and a zero scale makes its channel the
constant t, which RemoveZeroChannels takes out."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import TupleGetItemPattern, is_const, is_op, rewrite_call, wildcard

from ...counters import Counter
from .module_map import rewrite_functions

PRODUCERS = ("relax.nn.conv2d", "relax.nn.conv2d_transpose", "relax.matmul")


def _np(c) -> np.ndarray:
    return c.value.numpy()


def _scaled_weight(op_name: str, attrs, w: np.ndarray, s: np.ndarray, out_rank: int) -> np.ndarray | None:
    """W with output channel k scaled by s[k]; None if the layout is not one we fold."""
    if op_name == "relax.nn.conv2d":
        if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
            return None
        return w * s.reshape(-1, 1, 1, 1)
    if op_name == "relax.nn.conv2d_transpose":
        if attrs.data_layout != "NCHW" or attrs.kernel_layout != "IOHW":
            return None
        g = int(attrs.groups)
        cin, cout_g = w.shape[0], w.shape[1]
        return (w.reshape(g, cin // g, cout_g, *w.shape[2:]) * s.reshape(g, 1, cout_g, 1, 1)).reshape(w.shape)
    if w.ndim != 2:  # matmul: x @ W with W [K, N], channels are the last axis of the output
        return None
    return w * s.reshape(1, -1)


# what FoldBatchNorm counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("batchnorm_folded", int, "BatchNorms folded into weights", always=True),
    Counter("batchnorm_to_affine", int, "BatchNorms left as x*s+t", always=True),
)


@tvm.transform.module_pass(opt_level=1, name="FoldBatchNorm")
class FoldBatchNorm:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"batchnorm_folded": 0, "batchnorm_to_affine": 0}
        self.x, self.w, self.b = wildcard(), is_const(), is_const()
        self.gamma, self.beta, self.mean, self.var = is_const(), is_const(), is_const(), is_const()
        self.producers = [is_op(op)(self.x, self.w) for op in PRODUCERS]
        prod = self.producers[0] | self.producers[1] | self.producers[2]
        self.biased = is_op("relax.add")(prod, self.b)
        self.bn = is_op("relax.nn.batch_norm")(prod | self.biased, self.gamma, self.beta, self.mean, self.var)
        self.pattern = TupleGetItemPattern(self.bn, 0)
        self.lone = is_op("relax.nn.batch_norm")(wildcard(), self.gamma, self.beta, self.mean, self.var)
        self.lone_pattern = TupleGetItemPattern(self.lone, 0)

    def _affine(self, bn, m) -> tuple[np.ndarray, np.ndarray]:
        """BN's scale s and shift t (float64, per channel): BN(x) = x * s + t."""
        gamma = _np(m[self.gamma]).astype(np.float64) if bn.attrs.scale else 1.0
        beta = _np(m[self.beta]).astype(np.float64) if bn.attrs.center else 0.0
        mean, var = _np(m[self.mean]).astype(np.float64), _np(m[self.var]).astype(np.float64)
        s = gamma / np.sqrt(var + float(bn.attrs.epsilon))
        return s, beta - mean * s

    def _rewrite_lone(self, expr, m):
        bn = m[self.lone]
        x = bn.args[0]
        shape = getattr(x.ty, "shape", None)
        if bn.attrs.training or shape is None or not hasattr(shape, "values"):
            return expr
        rank, dtype = len(shape.values), str(x.ty.dtype)
        axis = int(bn.attrs.axis) % rank
        s, t = self._affine(bn, m)
        c = s.shape[0]
        if not isinstance(t, np.ndarray) or t.shape != (c,) or not dtype.startswith(("float", "bfloat")):
            return expr
        shape = [c] + [1] * (rank - 1 - axis)
        self.stats["batchnorm_to_affine"] += 1
        scaled = relax.op.multiply(x, relax.const(s.astype(dtype).reshape(shape)))
        return relax.op.add(scaled, relax.const(t.astype(dtype).reshape(shape)))

    def _rewrite(self, expr, m):
        bn = m[self.bn]
        if bn.attrs.training:  # batch statistics at run time: nothing to fold
            return expr
        prod = next(m[p] for p in self.producers if p in m)
        out_ty = prod.ty
        rank = len(out_ty.shape.values)
        axis = int(bn.attrs.axis) % rank
        channel_axis = 1 if prod.op.name != "relax.matmul" else rank - 1
        if axis != channel_axis:
            return expr
        s, t = self._affine(bn, m)
        w = _np(m[self.w])
        new_w = _scaled_weight(prod.op.name, prod.attrs, w.astype(np.float64), s, rank)
        if new_w is None:
            return expr
        c = s.shape[0]
        b = _np(m[self.b]).astype(np.float64).reshape(-1) if self.biased in m else np.zeros(c)
        if b.size != c:
            return expr
        shift = b * s + t
        bias_shape = [c] if prod.op.name == "relax.matmul" else [1, c] + [1] * (rank - 2)
        new_prod = relax.Call(prod.op, [prod.args[0], relax.const(new_w.astype(w.dtype))], prod.attrs)
        self.stats["batchnorm_folded"] += 1
        return relax.op.add(new_prod, relax.const(shift.astype(str(out_ty.dtype)).reshape(bias_shape)))

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        mod = rewrite_functions(mod, lambda f: rewrite_call(self.pattern, self._rewrite, f))
        mod = rewrite_functions(mod, lambda f: rewrite_call(self.lone_pattern, self._rewrite_lone, f))
        return relax.transform.DeadCodeElimination(["main"])(mod)
