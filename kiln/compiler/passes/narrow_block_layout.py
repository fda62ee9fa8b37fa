"""NarrowBlockLayout: block the convolutions ConvertLayout left in NCHW because their channels do
not divide the vector block (MobileNetV2's 24-channel stage: 96 -> 24, 24 -> 144, 144 -> 24), by
the widest block of at most `block` lanes that does divide them (24 -> NCHW8c), input and output
separately: a 96 -> 24 conv reads NCHW16c and writes NCHW8c (weights OIHW16i8o, constant).

  conv(x, w)  ->  unblock_bo(conv_blocked(block_bi(x), w_blocked))

Each channel count always gets the same block (the widest that divides it), so a tensor one conv
writes is in the layout the next conv reads: PropagateBlockedLayout (which runs next) moves every
unblock_b down through the bias, clip, residual adds and depthwise convs until it meets a block_b
and both cancel. Only float32 group-1 convs with constant weights are rewritten, and only when both
blocks are at least MIN_BLOCK lanes, except a float stem: a conv with too few input channels to block
(3) reads NCHW1c (the same bytes as NCHW) and writes NCHW{b}c, so what follows it runs blocked
(MobileNetV2's first depthwise conv, which then fuses with its 1x1 conv; ResNet-50's max pool, vectorized
over channels instead of strided along the width, several times faster, and no layout transform after
it). Such a conv has its own schedule (schedules/rules/stem.py).
A float32 conv whose input channels block but whose output channels have no block of MIN_BLOCK (RetinaNet's
heads: 9 anchors x 91 classes = 819, 9 x 4 = 36) gets zero filters up to padded_channels and a slice of the
real channels after it: its generic NCHW schedule ran the 819-channel head slowly, half of the model's time
(benchmarks/history.md). `stats["convs_padded"]` counts them.
uint8 x int8 convs are blocked for the target's int8 kernel instead of running TVM's generic int8 NCHW conv
(78-118 GOP/s against 300-560 for the blocked kernel on Zen 4, MobileNetV2-QDQ's 24-channel stage):
on AMX (legalize_amx) any channel blocks, as float, but not a stem; elsewhere the blocks of
schedules/int8.conv_blocks: outputs by the kernel's lanes or its half-width sibling (24 -> 3 x 8 on
AVX-512), inputs by a multiple of 4, and a stem's 3 input channels padded with a zero one to 4, so
each tap is one dot-product step. `stats["convs_blocked"]` counts them."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...capabilities import Int8Path
from ...counters import Counter
from ...schedules.rules.int8 import MIN_CHANNELS, Int8Kernel, conv_blocks
from ..ir import out_dtype
from .convert_layout import widest_block
from .counting import static_shape
from .module_map import rewrite_functions

MIN_BLOCK = 8


def padded_channels(o: int, block: int) -> int:
    """The output channel count a conv no block of MIN_BLOCK divides is padded to: the next multiple of
    `block` where that adds at most 1/16 (RetinaNet's 819-channel class head: 832), else of MIN_BLOCK where
    that adds at most 1/4 (its 36-channel box head: 40; a DCN's 27 offsets and masks: 32, whose generic NCHW
    conv ran at 9-16% of the FMA peak; a 21-class head: 24), else `o` (a 1- to 6-channel output stays)."""
    up = lambda m: -(-o // m) * m
    if up(block) - o <= o / 16:
        return up(block)
    return up(MIN_BLOCK) if up(MIN_BLOCK) - o <= o / 4 else o


def block_map(b: int):
    return lambda n, c, h, w: (n, c // b, h, w, c % b)


def unblock_map(b: int):
    return lambda n, cb, h, w, i: (n, cb * b + i, h, w)


def blocked_conv2d(a, x, w: np.ndarray, bi: int, bo: int, groups: int = 1, kernel_layout: str | None = None):
    """The conv of attributes `a` (an NCHW conv2d's) on x in NCHW{bi}c with blocked constant weights w,
    writing NCHW{bo}c; kernel_layout defaults to OIHW{bi}i{bo}o."""
    return relax.op.nn.conv2d(
        x,
        relax.const(np.ascontiguousarray(w), str(w.dtype)),
        strides=[int(s) for s in a.strides],
        padding=[int(p) for p in a.padding],
        dilation=[int(d) for d in a.dilation],
        groups=groups,
        data_layout=f"NCHW{bi}c",
        kernel_layout=kernel_layout or f"OIHW{bi}i{bo}o",
        out_layout=f"NCHW{bo}c",
        out_dtype=out_dtype(a),
    )


@relax.expr_functor.mutator
class _Narrow(relax.PyExprMutator):
    def __init__(self, mod, block: int, int8: Int8Kernel | None = None):
        super().__init__(mod)
        self.block, self.int8 = block, int8
        self.blocked = self.padded = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
            return call
        a = call.attrs
        x, w = call.args
        shape = static_shape(x)
        if (
            str(a.data_layout) != "NCHW"
            or str(a.kernel_layout) != "OIHW"
            or str(a.out_layout) != "NCHW"
            or int(a.groups) != 1
            or not isinstance(w, GenericConst)
            or shape is None
            or len(shape) != 4
            or (str(x.ty.dtype), str(w.value.dtype)) not in self.dtypes
        ):
            return call
        wa = w.value.numpy()
        o, i, kh, kw = wa.shape
        padded = o
        # AMX's tile conv takes any channel blocks but not a stem (fewer input channels than a dot-product step):
        # a stem takes the VNNI blocking every AMX CPU also runs (the AMX kernel entry's intrinsic is VNNI)
        if wa.dtype == np.int8 and self.int8 is not None and (self.int8.path != Int8Path.AMX_INT8 or i < MIN_CHANNELS):
            if (blocks := conv_blocks(self.int8, i, o)) is None:
                return call
            bi, bo = blocks
        else:
            bi, bo = widest_block(i, self.block), widest_block(o, self.block)
            padded = padded_channels(o, self.block) if bo < MIN_BLOCK <= bi and wa.dtype == np.float32 else o
            if padded != o:  # zero filters up to a blockable count, sliced off after the conv
                wa = np.concatenate([wa, np.zeros((padded - o, i, kh, kw), wa.dtype)])
                bo = widest_block(padded, self.block)
            if bo < MIN_BLOCK or (bi < MIN_BLOCK and str(x.ty.dtype) != "float32"):
                return call
        if i % bi:  # an int8 stem: zero input channels up to one dot-product step (their data never counts)
            wa = np.concatenate([wa, np.zeros((padded, bi - i % bi, kh, kw), wa.dtype)], axis=1)
        ci = wa.shape[1]
        w_b = wa.reshape(padded // bo, bo, ci // bi, bi, kh, kw).transpose(0, 2, 4, 5, 3, 1)
        pad = {"pad_value": 0} if ci != i else {}
        x_b = self.builder_.emit(relax.op.layout_transform(x, index_map=block_map(bi), **pad))
        conv = blocked_conv2d(a, x_b, w_b, bi, bo)
        self.blocked += 1
        out = relax.op.layout_transform(self.builder_.emit(conv), index_map=unblock_map(bo))
        if padded == o:
            return out
        self.padded += 1
        return relax.op.strided_slice(self.builder_.emit(out), axes=[1], begin=[0], end=[o])

    @property
    def dtypes(self) -> set:
        return {("float32", "float32"), ("uint8", "int8")} if self.int8 is not None else {("float32", "float32")}


# what NarrowBlockLayout counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("convs_blocked", int, "convs given a narrower channel block"),
    Counter("convs_padded", int, "convs whose channels were padded to the block"),
)


@tvm.transform.module_pass(opt_level=2, name="NarrowBlockLayout")
class NarrowBlockLayout:
    COUNTERS = COUNTERS

    def __init__(self, layout: str, block: int, int8: Int8Kernel | None = None):
        self.layout, self.block, self.int8 = layout, block, int8
        self.stats = {"convs_blocked": 0, "convs_padded": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        if self.layout != "NCHWc":
            return mod
        m = _Narrow(mod, self.block, self.int8)
        mod = rewrite_functions(mod, m.visit_expr)
        self.stats["convs_blocked"], self.stats["convs_padded"] = m.blocked, m.padded
        return mod


__all__ = ["NarrowBlockLayout"]
