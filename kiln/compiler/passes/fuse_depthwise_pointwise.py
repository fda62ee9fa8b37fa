"""FuseDepthwisePointwise: a depthwise conv (+ bias, + ReLU/Clip) whose only consumer is a 1x1 conv
(an inverted-residual block's depthwise -> projection, MobileNetV2 and its kin) becomes one kernel:
each output row's depthwise result is computed into a per-thread stack buffer and consumed there by
the 1x1 conv, so it is never written to memory and read back. FuseEpilogue then fuses the 1x1
conv's bias and residual add into the same kernel. Float32, NCHW{c}c layouts (after
ConvertLayout), any odd kernel size, stride 1 or 2, rows of up to 64 KiB (channels x output width).
Results equal the two kernels' (same arithmetic). `stats["depthwise_fused"]` counts the pairs;
`--disable-pass FuseDepthwisePointwise` keeps two kernels."""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, te, tirx, topi
from tvm.ir.expr import GenericConst
from tvm.ir.prim.expr import FloatImm

from ...counters import Counter
from ...schedules.rules.dwpw import MAX_ROW_FLOATS
from ...schedules.rules.kinds import declare
from ..ir import register_kernel, var_uses
from .counting import float32_conv, nchwc_block
from .module_map import rewrite_with

# name hint of the kernels (FuseEpilogue anchors on it, the schedule registry knows its blocks)
PRIMFUNC = register_kernel("dwpw_conv2d", "nn.conv2d_depthwise_pointwise", convs=2)


def dwpw_conv2d(x, wd, bias, wp, strides, padding, lo: float, hi: float):
    """x [N, C/c, H, W, c], wd [C/c, 1, KH, KW, 1, c] (OIHW1i{c}o), bias [1, C/c, 1, 1, c],
    wp [O/o, C/c, 1, 1, c, o] (OIHW{c}i{o}o) -> [N, O/o, OH, OW, o]; the depthwise result is clamped
    to [lo, hi] (infinite bounds: no clamp)."""
    n, cb, h, w, c = (int(v) for v in x.shape)
    _, _, kh, kw, _, _ = (int(v) for v in wd.shape)
    ob, _, _, _, ci, co = (int(v) for v in wp.shape)
    (sh, sw), (pt, pl, pb, pr) = strides, padding
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    padded = topi.nn.pad(x, [0, 0, pt, pl, 0], [0, 0, pb, pr, 0], name="dwpw_pad")
    rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")
    dw = te.compute(
        (n, cb, oh, ow, c),
        lambda b, i, y, xx, k: te.sum(
            padded[b, i, y * sh + rh, xx * sw + rw, k] * wd[i, 0, rh, rw, 0, k], axis=[rh, rw]
        ),
        name="dwpw_depthwise",
    )

    def act(b, i, y, xx, k):
        v = dw[b, i, y, xx, k] + bias[0, i, 0, 0, k]
        if lo > -math.inf:
            v = te.max(v, tirx.const(lo, "float32"))
        if hi < math.inf:
            v = te.min(v, tirx.const(hi, "float32"))
        return v

    d = te.compute(dw.shape, act, name="dwpw_act")
    r = te.reduce_axis((0, cb * c), "r")
    return te.compute(
        (n, ob, oh, ow, co),
        lambda b, o, y, xx, j: te.sum(d[b, r // c, y, xx, r % c] * wp[o, r // ci, 0, 0, r % ci, j], axis=[r]),
        name="dwpw_pointwise",
        attrs=declare("depthwise_pointwise"),  # the anchor; the other stages are part of its kernel
    )


def _pointwise(call) -> bool:
    if not float32_conv(call):
        return False
    a, wshape = call.attrs, list(call.args[1].value.shape)
    c, co = nchwc_block(str(a.data_layout)), nchwc_block(str(a.out_layout))
    return (
        c is not None
        and co is not None
        and int(a.groups) == 1
        and len(wshape) == 6
        and wshape[2:4] == [1, 1]
        and str(a.kernel_layout) == f"OIHW{c}i{co}o"
        and [int(s) for s in a.strides] == [1, 1]
        and [int(p) for p in a.padding] == [0, 0, 0, 0]
        and [int(d) for d in a.dilation] == [1, 1]
    )


def _depthwise(call, c: int) -> bool:
    if not float32_conv(call):
        return False
    a, shape, wshape = call.attrs, [int(v) for v in call.args[0].ty.shape.values], list(call.args[1].value.shape)
    return (
        str(a.data_layout) == f"NCHW{c}c"
        and str(a.out_layout) == f"NCHW{c}c"
        and str(a.kernel_layout) == f"OIHW1i{c}o"
        and len(shape) == 5
        and int(a.groups) == shape[1] * c
        and len(wshape) == 6
        and wshape[0] == shape[1]
        and wshape[2] % 2 == 1
        and wshape[3] % 2 == 1
        and [int(s) for s in a.strides] in ([1, 1], [2, 2])
        and [int(d) for d in a.dilation] == [1, 1]
    )


def _bounds(call) -> tuple[float, float] | None:
    """The clamp of a ReLU / Clip call, else None."""
    if not isinstance(call.op, tvm.ir.Op):
        return None
    if call.op.name == "relax.nn.relu":
        return 0.0, math.inf
    if call.op.name == "relax.clip" and all(isinstance(v, FloatImm) for v in call.args[1:]):
        return float(call.args[1].value), float(call.args[2].value)
    return None


@relax.expr_functor.mutator
class _Fuser(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.uses: dict = {}
        self.count = 0

    def _producer(self, e):
        """The call bound to e (through var aliases), when e is a var used only once."""
        while isinstance(e, relax.Var) and self.uses.get(e, 0) == 1:
            e = self.lookup_binding(e)
        return e if isinstance(e, relax.Call) else None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not _pointwise(call):
            return call
        c = nchwc_block(str(call.attrs.data_layout))
        top = self._producer(call.args[0])
        lo, hi = -math.inf, math.inf
        clamp = _bounds(top) if top is not None else None
        if clamp is not None:
            (lo, hi), top = clamp, self._producer(top.args[0])
        bias = None
        if (
            top is not None
            and isinstance(top.op, tvm.ir.Op)
            and top.op.name == "relax.add"
            and isinstance(top.args[1], GenericConst)
        ):
            bias, top = top.args[1], self._producer(top.args[0])
        if top is None or not _depthwise(top, c):
            return call
        cb, ow = int(top.args[0].ty.shape.values[1]), int(call.args[0].ty.shape.values[3])
        if cb * c * ow > MAX_ROW_FLOATS:  # a depthwise row must fit the kernel's stack buffer
            return call
        if bias is None:
            bias = relax.const(np.zeros((1, cb, 1, 1, c), "float32"))
        elif list(bias.value.shape) != [1, cb, 1, 1, c] or str(bias.ty.dtype) != "float32":
            return call
        a = top.attrs
        self.count += 1
        return self.builder_.call_te(
            dwpw_conv2d,
            top.args[0],
            top.args[1],
            bias,
            call.args[1],
            [int(s) for s in a.strides],
            [int(p) for p in a.padding],
            lo,
            hi,
            primfunc_name_hint=PRIMFUNC,
        )


# what FuseDepthwisePointwise counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("depthwise_fused", int, "depthwise + 1x1 conv pairs as one kernel", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="FuseDepthwisePointwise")
class FuseDepthwisePointwise:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"depthwise_fused": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        fuser = _Fuser(mod)
        out, count = rewrite_with(mod, fuser, prepare=lambda f: setattr(fuser, "uses", var_uses(f)))
        self.stats["depthwise_fused"] += count
        return out
