"""ConvertLayout: run conv nets in NHWC (or keep NCHW). Transforms are inserted only at the graph
edges: TVM's ConvertLayout propagates the layout through layout-agnostic ops, and weight
transposes are constants that FoldConstants computes at compile time. layout_guards keeps TVM's
ConvertLayout away from the ops it mis-converts on a blocked tensor (each reads NCHW instead).
`stats["layout_transforms"]` counts the data transforms left in the graph."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ...errors import OptionsError
from . import numpy_fold
from .layout_guards import guard, unguard
from .module_map import rewrite_calls

LAYOUTS = ("NCHW", "NHWC", "NCHWc")


def desired_layouts(layout: str, block: int) -> dict | None:
    """conv2d is the anchor; pooling and elementwise ops follow the layout of their input. NCHWc
    blocks channels by the vector width (convs whose channels do not divide stay NCHW here;
    NarrowBlockLayout blocks them by a narrower width next)."""
    if layout == "NHWC":
        return {"relax.nn.conv2d": ["NHWC", "OHWI"]}
    if layout == "NCHWc":
        return {"relax.nn.conv2d": [f"NCHW{block}c", f"OIHW{block}i{block}o"]}
    return None


def vector_block(features: list[str]) -> int:
    """float32 lanes of the widest vector unit the target has."""
    return 16 if "avx512f" in features else 8 if "avx2" in features or "avx" in features else 4


def widest_block(n: int, block: int) -> int:
    """The widest power-of-two block of at most `block` lanes that divides n (1 if none)."""
    b = block
    while b > 1 and n % b:
        b //= 2
    return b


def count_layout_transforms(mod: tvm.IRModule) -> int:
    """permute_dims/layout_transform calls on non-constant data in main."""
    n = 0

    def visit(e):
        nonlocal n
        if (
            isinstance(e, relax.Call)
            and isinstance(e.op, tvm.ir.Op)
            and e.op.name in ("relax.permute_dims", "relax.layout_transform")
        ):
            if not isinstance(e.args[0], GenericConst):
                n += 1

    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f.body, visit)
    return n


def has_conv2d(mod: tvm.IRModule) -> bool:
    found = []
    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(
                f.body,
                lambda e: (
                    found.append(1)
                    if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.nn.conv2d"
                    else None
                ),
            )
    return bool(found)


def _bool_transform_as_uint8(builder, call):
    """layout_transform of a bool tensor (a mask of a Cast's finiteness test, say) as one of uint8: TVM's
    lowering fills padding with float 0.0 whatever the dtype, and its schedule refuses that for bool
    ("fills padding with float32"); FoldConstant lowers every call it meets, so the whole pass failed and
    ddddocr's dynamically quantized OCR model ran without any layout (3.2x onnxruntime). Casts around it
    fuse into the neighbouring elementwise kernels."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.layout_transform"):
        return None
    if str(call.args[0].ty.dtype) != "bool":
        return None
    a = call.attrs
    wide = builder.normalize(relax.op.astype(call.args[0], "uint8"))
    moved = builder.normalize(relax.op.layout_transform(wide, a.index_map, None if a.pad_value is None else 0))
    return relax.op.astype(moved, "bool")


# what ConvertLayout counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("layout_transforms", int, "layout transforms left after the graph passes", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="ConvertLayout")
class ConvertLayout:
    COUNTERS = COUNTERS

    def __init__(self, layout: str = "NCHW", block: int = 16):
        if layout not in LAYOUTS:
            raise OptionsError(
                f"unknown layout {layout!r}", where="--layout", fix=f"use one of {', '.join(LAYOUTS + ('auto',))}"
            )
        self.layout, self.block = layout, block
        self.stats = {"layout_transforms": 0}
        self.guarded = 0  # ops layout_guards kept from TVM's mis-conversions (not a report counter)

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        before = count_layout_transforms(mod)
        desired = desired_layouts(self.layout, self.block)
        if desired and has_conv2d(mod):  # TVM's ConvertLayout breaks on some ops (stack) it has no reason to touch
            mod, guarded = guard(mod, blocked=self.layout == "NCHWc")  # the ops TVM mis-converts read NCHW
            mod = relax.transform.ConvertLayout(desired)(mod)
            mod, _ = rewrite_calls(mod, _bool_transform_as_uint8)
            mod = relax.transform.FoldConstant()(numpy_fold.fold(mod))  # weights re-laid out now, not at run time
            mod, ungrouped = unguard(mod)
            self.guarded = guarded + ungrouped
        self.stats["layout_transforms"] = count_layout_transforms(mod) - before
        return mod
