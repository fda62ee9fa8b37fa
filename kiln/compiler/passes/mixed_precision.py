"""MixedPrecision: run conv2d and matmul on fp16 or bf16 operands with fp32 accumulation.

Inputs of each conv2d/matmul are cast to the reduced type (constant weights converted here, at
compile time, so the artifact stores them at half size); the op accumulates and returns float32,
so every other op (softmax, layer norm, residual adds) stays fp32. TVM's ToMixedPrecision does
fp16 only; this one pass serves both. `stats["mixed_precision_ops"]` counts the ops converted."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from .module_map import rewrite_functions

DTYPES = {"fp16": ("float16", np.float16), "bf16": ("bfloat16", ml_dtypes.bfloat16)}
OPS = ("relax.nn.conv2d", "relax.matmul")


@relax.expr_functor.mutator
class _Cast(relax.PyExprMutator):
    def __init__(self, mod, dtype: str, np_dtype):
        super().__init__(mod)
        self.dtype, self.np_dtype, self.converted = dtype, np_dtype, 0

    def _cast(self, e):
        if isinstance(e, GenericConst):
            return relax.const(e.value.numpy().astype(self.np_dtype), self.dtype)
        return relax.op.astype(e, self.dtype)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in OPS:
            return call
        if any(str(a.ty.dtype) != "float32" for a in call.args[:2]):
            return call
        x, w = (self._cast(a) for a in call.args[:2])
        self.converted += 1
        if call.op.name == "relax.matmul":
            return relax.op.matmul(x, w, "float32")
        a = call.attrs
        return relax.op.nn.conv2d(x, w, [int(s) for s in a.strides], [int(p) for p in a.padding], [int(d) for d in a.dilation],
                                  int(a.groups), a.data_layout, a.kernel_layout, a.out_layout, "float32")


@tvm.transform.module_pass(opt_level=1, name="MixedPrecision")
class MixedPrecision:
    def __init__(self, precision: str):
        self.dtype, self.np_dtype = DTYPES[precision]
        self.stats = {"mixed_precision_ops": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        cast = _Cast(mod, self.dtype, self.np_dtype)
        out = rewrite_functions(mod, cast.visit_expr)
        self.stats["mixed_precision_ops"] += cast.converted
        return out
