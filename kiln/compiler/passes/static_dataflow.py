"""StaticDataflow: put the statically shaped, side-effect-free bindings of a function that TVM's importer
left outside dataflow blocks back into dataflow blocks.

TVM's ONNX importer emits the whole graph as one plain binding block when one op in it is impure
(detection models' NonZero). TVM's FoldConstant, ConvertLayout and FuseOps act only inside dataflow
blocks, so such a model got no constant folding, no layout conversion and no fusion: FasterRCNN ran
901 kernels, its weights transposed on every run; RetinaNet, SSDlite and silero VAD's if-less export
the same. Runs of consecutive pure bindings with static shapes become dataflow blocks (their variables
stay ordinary variables, visible after the block); bindings that are impure or sized at run time stay
where they were: TVM's FuseTIR and ConvertLayout fail on some run-time-sized regions (a box head's
dynamic slices), and those regions compiled as they are today. `stats["dataflow_regions"]` counts the
blocks made."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.analysis import contains_impure_call, tir_vars_in_type

from ...counters import Counter

MIN_RUN = 2  # shorter runs are not worth a block


def _static_pure(b) -> bool:
    if not isinstance(b, relax.VarBinding) or contains_impure_call(b.value):
        return False
    return not tir_vars_in_type(b.var.ty)


def _runs(bindings) -> list[tuple[bool, list]]:
    """The bindings as consecutive (dataflow?, bindings) groups: runs of MIN_RUN or more static pure
    bindings are dataflow, everything between them is not."""
    groups: list[tuple[bool, list]] = []
    for b in bindings:
        flag = _static_pure(b)
        if groups and groups[-1][0] == flag:
            groups[-1][1].append(b)
        else:
            groups.append((flag, [b]))
    merged: list[tuple[bool, list]] = []
    for flag, bs in groups:
        flag = flag and len(bs) >= MIN_RUN
        if merged and not flag and not merged[-1][0]:
            merged[-1][1].extend(bs)
        else:
            merged.append((flag, bs))
    return merged


def _regroup(func: relax.Function) -> tuple[relax.Function, int]:
    body = func.body
    if not isinstance(body, relax.SeqExpr) or all(isinstance(b, relax.DataflowBlock) for b in body.blocks):
        return func, 0
    blocks, made = [], 0
    for blk in body.blocks:
        if isinstance(blk, relax.DataflowBlock):
            blocks.append(blk)
            continue
        for flag, bs in _runs(blk.bindings):
            blocks.append(relax.DataflowBlock(bs) if flag else relax.BindingBlock(bs))
            made += flag
    if not made:
        return func, 0
    new = relax.Function(func.params, relax.SeqExpr(blocks, body.body), func.ret_ty, func.is_pure, func.attrs)
    return new, made


# what StaticDataflow counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (Counter("dataflow_regions", int, "bindings moved back into dataflow blocks"),)


@tvm.transform.module_pass(opt_level=0, name="StaticDataflow")
class StaticDataflow:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"dataflow_regions": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, f in mod.functions.items():
            if isinstance(f, relax.Function) and not (f.attrs and f.attrs.get("Primitive")):
                new, made = _regroup(f)
                if made:
                    out[gv] = new
                    self.stats["dataflow_regions"] += made
        return out
