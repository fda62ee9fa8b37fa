"""FoldBatchNorm: fold an inference BatchNorm into the conv2d / conv2d_transpose / matmul that
feeds it (also when a constant bias add sits between them). The producer's weights are scaled
per output channel and one bias add remains:  BN(P(x, W) + b) = P(x, W * s) + ((b - mean) * s + beta)
with s = gamma / sqrt(var + eps). New weights are computed here, in float64, at compile time."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import TupleGetItemPattern, is_const, is_op, rewrite_call, wildcard

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


@tvm.transform.module_pass(opt_level=1, name="FoldBatchNorm")
class FoldBatchNorm:
    def __init__(self):
        self.stats = {"batchnorm_folded": 0}
        self.x, self.w, self.b = wildcard(), is_const(), is_const()
        self.gamma, self.beta, self.mean, self.var = is_const(), is_const(), is_const(), is_const()
        self.producers = [is_op(op)(self.x, self.w) for op in PRODUCERS]
        prod = self.producers[0] | self.producers[1] | self.producers[2]
        self.biased = is_op("relax.add")(prod, self.b)
        self.bn = is_op("relax.nn.batch_norm")(prod | self.biased, self.gamma, self.beta, self.mean, self.var)
        self.pattern = TupleGetItemPattern(self.bn, 0)

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
        gamma = _np(m[self.gamma]).astype(np.float64) if bn.attrs.scale else 1.0
        beta = _np(m[self.beta]).astype(np.float64) if bn.attrs.center else 0.0
        mean, var = _np(m[self.mean]).astype(np.float64), _np(m[self.var]).astype(np.float64)
        s = gamma / np.sqrt(var + float(bn.attrs.epsilon))
        w = _np(m[self.w])
        new_w = _scaled_weight(prod.op.name, prod.attrs, w.astype(np.float64), s, rank)
        if new_w is None:
            return expr
        c = s.shape[0]
        b = _np(m[self.b]).astype(np.float64).reshape(-1) if self.biased in m else np.zeros(c)
        if b.size != c:
            return expr
        shift = (b - mean) * s + beta
        bias_shape = [c] if prod.op.name == "relax.matmul" else [1, c] + [1] * (rank - 2)
        new_prod = relax.Call(prod.op, [prod.args[0], relax.const(new_w.astype(w.dtype))], prod.attrs)
        self.stats["batchnorm_folded"] += 1
        return relax.op.add(new_prod, relax.const(shift.astype(str(out_ty.dtype)).reshape(bias_shape)))

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        mod = rewrite_functions(mod, lambda f: rewrite_call(self.pattern, self._rewrite, f))
        return relax.transform.DeadCodeElimination(["main"])(mod)
