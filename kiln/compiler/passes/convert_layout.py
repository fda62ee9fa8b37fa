"""ConvertLayout: run conv nets in NHWC (or keep NCHW). Transforms are inserted only at the graph
edges: TVM's ConvertLayout propagates the layout through layout-agnostic ops, and weight
transposes are constants that FoldConstants computes at compile time.
`stats["layout_transforms"]` counts the data transforms left in the graph."""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...errors import OptionsError

LAYOUTS = ("NCHW", "NHWC")
# conv2d is the anchor; pooling and elementwise ops follow the layout of their input
DESIRED = {"NHWC": {"relax.nn.conv2d": ["NHWC", "OHWI"]}}


def count_layout_transforms(mod: tvm.IRModule) -> int:
    """permute_dims/layout_transform calls on non-constant data in main."""
    n = 0

    def visit(e):
        nonlocal n
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in ("relax.permute_dims", "relax.layout_transform"):
            if not isinstance(e.args[0], GenericConst):
                n += 1
    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f.body, visit)
    return n


@tvm.transform.module_pass(opt_level=2, name="ConvertLayout")
class ConvertLayout:
    def __init__(self, layout: str = "NCHW"):
        if layout not in LAYOUTS:
            raise OptionsError(f"unknown layout {layout!r}", fix=f"use one of {', '.join(LAYOUTS + ('auto',))}")
        self.layout = layout
        self.stats = {"layout_transforms": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        before = count_layout_transforms(mod)
        if self.layout in DESIRED:
            mod = relax.transform.ConvertLayout(DESIRED[self.layout])(mod)
            mod = relax.transform.FoldConstant()(mod)  # weights re-laid out now, not at run time
        self.stats["layout_transforms"] = count_layout_transforms(mod) - before
        return mod
