"""ClipTakeIndices: every `take` whose indices are computed at run time clamps them into the data (TVM's "clip"
mode) instead of reading wherever they point ("fast", TVM's default). A token id past the vocabulary read outside
the embedding table and took the process down: a segfault in `Model.run`, and in `kiln serve` the server (BERT
from ONNX, an nn.Embedding from torch.export), for every frontend; frontends/tvm_indices.py clamps the ONNX
importer's other gathers and scatters. Required: a model is never built without it.
`stats["takes_clipped"]` counts the takes it changed."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter


@relax.expr_functor.mutator
class _Clip(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.count = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.take"):
            return call
        data, indices = call.args
        if isinstance(indices, GenericConst) or str(call.attrs.mode) != "fast":
            return call
        self.count += 1
        axis = call.attrs.axis
        return relax.op.take(data, indices, None if axis is None else int(axis), mode="clip")


COUNTERS: tuple[Counter, ...] = (Counter("takes_clipped", int, "run-time gathers clamped into their data"),)


@tvm.transform.module_pass(opt_level=0, name="ClipTakeIndices")
class ClipTakeIndices:
    COUNTERS = COUNTERS

    def __init__(self):
        self.stats = {"takes_clipped": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function):
                rw = _Clip(mod)
                out[gv] = rw.visit_expr(func)
                self.stats["takes_clipped"] += rw.count
        return out
