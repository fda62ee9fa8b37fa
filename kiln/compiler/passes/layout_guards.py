"""Guards around TVM's relax ConvertLayout, which breaks valid graphs when a blocked (NCHW{c}c) tensor
reaches an op whose layout inference mishandles sub-indexed layouts (TVM 0.27, src/relax/op/*):

  - conv2d_transpose without a desired layout "propagates" the 5-D blocked layout into a 4-D layout
    string: "Layouts must have the same size" (FPN / DBNet upsampling heads);
  - split by indices keeps the indices in channel units but applies them to the outer C/c axis: a
    32-channel tensor split [16, 16] in NCHW16c gives [2, 0] blocks, and the next conv sees "the data
    channel size is T.int64(0)" (YOLOv8's C2f: conv -> Split(2) -> ...);
  - layer_norm / rms_norm / group_norm over the channel axis map the axis to the outer C/c axis and
    leave gamma at C: "(T.int64(32),) and (T.int64(256),) that are unequal" (ConvNeXt's channel LayerNorm);
    over several axes with C among them (ONNX LayerNormalization axis=1 of [N, C, H, W]) even NHWC is
    wrong: the axes are permuted, gamma [C, H, W] is not (wrong numbers, no error);
  - mean/sum/max/... over the channel axis with keepdims make a [N, 1, H, W, 1] tensor labelled
    NCHW{c}c ("Could not parse mapping as sum of iterators"), and a binary op of a blocked tensor and
    a [N, 1, H, W] one (x - mean(x, axis=1), a spatial attention mask) blocks the 1-channel operand:
    "Cannot broadcast from 5 to 4" (LayerNorm written out over axis 1, CBAM-style masks);
  - a comparison makes a bool NCHW{c}c tensor that no layout_transform takes back to NCHW (its
    padding value is a float32 0): "Buffer te_layout_transform has elements of type T.bool";
  - squeeze with a negative axis writes out of bounds even without any blocked tensor: std::bad_alloc
    (dynamo-exported Swin);
  - stack gives its output a layout its consumers cannot read ("Invalid SLayout: can't find S in source
    layout ABC", a box decoder's max over a stacked axis), with no blocked tensor anywhere near: it
    becomes a concat of expand_dims;
  - grouped (not depthwise) convs whose per-group channels divide the block are converted to
    NCHW{c}c with groups > 1, a conv no legalization lowers ("Only call_tir ... in primitive function,
    but got: R.nn.conv2d", ShuffleNet's grouped 1x1 convs).

`guard` runs before ConvertLayout: it normalizes squeeze axes, turns equal channel splits into
sections (which TVM splits correctly on the outer axis, so C2f stays blocked), and puts a layout
barrier (a reshape to the same shape: reshape has no layout inference, so ConvertLayout hands it
NCHW) in front of each op above that would read a blocked tensor. `unguard` runs after: it drops
the barriers (only the layout_transform back to NCHW they caused is left, right at that op) and
puts the grouped convs ConvertLayout blocked back in NCHW between layout_transforms (BlockGroupedConv
then blocks them with a kernel that exists). Every other op keeps the blocked layout ConvertLayout gives it."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst
from tvm.ir.prim.expr import IntImm

from ..ir import op_name, out_dtype
from .counting import nchwc_block, static_shape
from .module_map import rewrite_functions

NORMS = ("relax.nn.layer_norm", "relax.nn.rms_norm")
REDUCTIONS = ("relax.mean", "relax.sum", "relax.max", "relax.min", "relax.prod", "relax.variance", "relax.std")
BINARY = (
    "relax.add",
    "relax.subtract",
    "relax.multiply",
    "relax.divide",
    "relax.floor_divide",
    "relax.power",
    "relax.maximum",
    "relax.minimum",
)
COMPARE = ("relax.equal", "relax.not_equal", "relax.greater", "relax.greater_equal", "relax.less", "relax.less_equal")


def _axes(axes, ndim: int) -> list[int]:
    return [(int(a) + ndim) % ndim for a in axes]


def _is_4d(e) -> bool:
    s = static_shape(e)
    return s is not None and len(s) == 4


@relax.expr_functor.mutator
class _Guard(relax.PyExprMutator):
    def __init__(self, mod, blocked: bool):
        super().__init__(mod)
        self.blocked = blocked  # the barriers only matter when ConvertLayout makes NCHW{c}c tensors
        self.count = 0

    def _barrier(self, e):
        """e behind a reshape to its own shape: ConvertLayout gives the reshape its input in NCHW."""
        if isinstance(e, GenericConst) or not _is_4d(e):
            return e
        self.count += 1
        return self.builder_.emit(relax.op.reshape(e, static_shape(e)))

    def _with_args(self, call, args):
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = op_name(call)
        if (
            name == "relax.squeeze"
            and call.attrs.axis is not None
            and int(call.args[0].ty.ndim) > 0
            and any(int(a) < 0 for a in call.attrs.axis)
        ):
            self.count += 1
            return relax.op.squeeze(call.args[0], _axes(call.attrs.axis, int(call.args[0].ty.ndim)))
        if name == "relax.stack":
            # TVM infers a layout for stack's output that its consumers cannot read ("Invalid SLayout: can't
            # find S in source layout ABC", "Index -1 out of bounds", FasterRCNN's box decoding): the same
            # as a concat of expand_dims, whose layouts TVM infers right
            t = call.args[0]
            fields = t.fields if isinstance(t, relax.Tuple) else None
            if fields:
                self.count += 1
                axis = int(call.attrs.axis)
                return relax.op.concat([self.builder_.emit(relax.op.expand_dims(f, axis)) for f in fields], axis)
        if name is None or not call.args or not _is_4d(call.args[0]):
            return call
        x = call.args[0]
        if name in NORMS and len(call.attrs.axes) > 1 and 1 in _axes(call.attrs.axes, 4):
            return self._with_args(call, [self._barrier(x), *call.args[1:]])  # NHWC too: gamma [C, H, W] stays CHW
        if not self.blocked:
            return call
        if name == "relax.split" and int(call.attrs.axis) in (1, -3):
            return self._split(call, x)
        if name == "relax.nn.conv2d_transpose":
            return self._with_args(call, [self._barrier(x), *call.args[1:]])
        if name == "relax.nn.group_norm" or (name in NORMS and 1 in _axes(call.attrs.axes, 4)):
            return self._with_args(call, [self._barrier(x), *call.args[1:]])
        if (
            name in REDUCTIONS
            and bool(call.attrs.keepdims)
            and (call.attrs.axis is None or 1 in _axes(call.attrs.axis, 4))
        ):
            return self._with_args(call, [self._barrier(x)])
        if name in BINARY and len(call.args) == 2:
            return self._binary(call)
        if name in COMPARE:  # a bool NCHW{c}c tensor cannot be transformed back (its padding value is a float)
            return self._with_args(call, [self._barrier(a) for a in call.args])
        return call

    def _split(self, call, x):
        """Equal parts by indices -> by sections (correct in NCHW{c}c); unequal ones read NCHW."""
        ios = call.attrs.indices_or_sections
        if isinstance(ios, (int, IntImm)):
            return call  # already sections
        channels = static_shape(x)[1]
        bounds = [0, *(int(i) for i in ios), channels]
        sizes = {b - a for a, b in zip(bounds, bounds[1:])}
        if len(sizes) == 1 and sizes.pop() > 0:
            self.count += 1
            return relax.op.split(x, len(bounds) - 1, axis=1)
        return self._with_args(call, [self._barrier(x)])

    def _binary(self, call):
        """A blocked tensor with a channel-broadcast ([N, 1, H, W]) operand: the op reads NCHW; a
        [1, 1, 1, 1] constant becomes a scalar (it broadcasts the same in any layout)."""
        a, b = call.args
        sa, sb = static_shape(a), static_shape(b)
        if sa is None or sb is None or not sa or not sb or len(sa) > 4 or len(sb) > 4 or max(len(sa), len(sb)) != 4:
            return call  # scalars broadcast in any layout
        ca, cb = [(1, *s)[-3] if len(s) >= 3 else 1 for s in (sa, sb)]
        if ca == cb or 1 not in (ca, cb):
            return call
        one, other = (b, a) if cb == 1 else (a, b)
        if isinstance(one, GenericConst) and static_shape(one) == (1, 1, 1, 1):
            self.count += 1
            scalar = relax.const(one.value.numpy().reshape(()), str(one.value.dtype))
            return self._with_args(call, [other, scalar] if one is b else [scalar, other])
        return self._with_args(call, [self._barrier(a), self._barrier(b)])


@relax.expr_functor.mutator
class _Unguard(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.count = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = op_name(call)
        if name == "relax.reshape":
            s = static_shape(call.args[0])
            if s is not None and s == static_shape(call):
                return call.args[0]  # a barrier (or any reshape that changes nothing)
        if name == "relax.nn.conv2d" and int(call.attrs.groups) > 1:
            return self._grouped(call)
        return call

    def _grouped(self, call):
        """A grouped conv ConvertLayout blocked (OIHW{c}i{c}o weight, groups > 1: no kernel lowers it)
        back in NCHW, between layout_transforms (a depthwise conv's OIHW1i{c}o has Kiln's kernel)."""
        a = call.attrs
        x, w = call.args
        bi, bo = nchwc_block(str(a.data_layout)), nchwc_block(str(a.out_layout))
        if bi is None or bo is None or str(a.kernel_layout) != f"OIHW{bi}i{bo}o" or not isinstance(w, GenericConst):
            return call
        wb = w.value.numpy()  # [O/bo, I/g/bi, KH, KW, bi, bo]
        ob, ib, kh, kw = wb.shape[:4]
        w_oihw = np.ascontiguousarray(wb.transpose(0, 5, 1, 4, 2, 3).reshape(ob * bo, ib * bi, kh, kw))
        x_nchw = self.builder_.emit(
            relax.op.layout_transform(x, index_map=lambda n, cb, h, w_, i: (n, cb * bi + i, h, w_))
        )
        odt = out_dtype(a)
        conv = self.builder_.emit(
            relax.op.nn.conv2d(
                x_nchw,
                relax.const(w_oihw, str(wb.dtype)),
                strides=[int(s) for s in a.strides],
                padding=[int(p) for p in a.padding],
                dilation=[int(d) for d in a.dilation],
                groups=int(a.groups),
                out_dtype=odt,
            )
        )
        self.count += 1
        return relax.op.layout_transform(conv, index_map=lambda n, c, h, w_: (n, c // bo, h, w_, c % bo))


def _rewrite(mod: tvm.IRModule, mutator) -> tvm.IRModule:
    return rewrite_functions(mod, mutator.visit_expr)


def guard(mod: tvm.IRModule, blocked: bool) -> tuple[tvm.IRModule, int]:
    """The module ConvertLayout can convert (see the module docstring) and how many ops were guarded."""
    g = _Guard(mod, blocked)
    out = _rewrite(mod, g)
    return out, g.count


def unguard(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """Barriers removed, grouped blocked convs back in NCHW; the count of the convs put back."""
    u = _Unguard(mod)
    out = relax.transform.CanonicalizeBindings()(_rewrite(mod, u))
    return out, u.count


__all__ = ["guard", "unguard"]
