"""MixedPrecision: run conv2d and matmul on fp16 or bf16 operands with fp32 accumulation.

Inputs of each conv2d/matmul are cast to the reduced type (constant weights converted here, at compile time, so the
artifact stores them at half size); the op accumulates and returns float32, so every other op (softmax, layer norm,
residual adds) stays fp32. TVM's ToMixedPrecision does fp16 only; this one pass serves both. Grouped/depthwise convs
stay float32: TVM computes reduced types in float32 registers, so their casts would only add kernels. `kernels`
names the passes of this build that run convs well: when it has BF16ConvKernel (bf16 on AVX512-BF16, convs in
NCHW16c), a conv becomes bf16 only where a bf16 kernel takes it: Kiln's vdpbf16ps kernel (batch 1, input and output
channels multiples of 16) or, with Winograd, Winograd (3x3, stride 1, bf16 weights); the rest (e.g. MobileNetV2's
24-channel convs, the 3-channel stem; FuseDepthwisePointwise still fuses the depthwise convs before float32
projections) stay float32, and so do matmuls wherever `kernels` has BF16MatmulKernel (AVX512-BF16, Arm BF16) or
FP16MatmulKernel (arm64 fp16): TVM has no such kernels, and those passes take float32 matmuls by constant weights.
Converting every conv made MobileNetV2 slower than float32; converting only these makes it faster
(benchmarks/history.md, "Reduced precision"). `stats["mixed_precision_ops"]` counts the ops converted,
`mixed_precision_kept` the ones left in float32."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from .counting import REDUCED_TYPES
from .module_map import rewrite_functions
from .winograd import geometry as winograd_geometry

OPS = ("relax.nn.conv2d", "relax.matmul")
BLOCK = 16  # the channel block of the vdpbf16ps kernel (NCHW16c)


@relax.expr_functor.mutator
class _Cast(relax.PyExprMutator):
    def __init__(self, mod, dtype: str, np_dtype, kernels: frozenset):
        super().__init__(mod)
        self.dtype, self.np_dtype, self.converted, self.kept = dtype, np_dtype, 0, 0
        self.kernels = kernels

    def _keep_float(self, call) -> bool:
        """A conv2d or matmul no reduced-precision kernel would take better than float32 does."""
        if call.op.name == "relax.matmul":  # BF16MatmulKernel and FP16MatmulKernel take float32 matmuls
            return bool({"BF16ConvKernel", "BF16MatmulKernel", "FP16MatmulKernel"} & self.kernels)
        a = call.attrs
        if int(a.groups) != 1:
            return True
        if "BF16ConvKernel" not in self.kernels:
            return False
        x, w = [int(v) for v in call.args[0].ty.shape.values], [int(v) for v in call.args[1].ty.shape.values]
        if str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW" or len(x) != 4 or len(w) != 4:
            return True
        winograd = "Winograd" in self.kernels and winograd_geometry(a, w[2:])
        return bool(
            w[0] % BLOCK or w[1] % BLOCK or any(int(d) != 1 for d in a.dilation) or (x[0] != 1 and not winograd)
        )

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
        if self._keep_float(call):
            self.kept += 1
            return call
        x, w = (self._cast(a) for a in call.args[:2])
        self.converted += 1
        if call.op.name == "relax.matmul":
            return relax.op.matmul(x, w, "float32")
        a = call.attrs
        return relax.op.nn.conv2d(
            x,
            w,
            [int(s) for s in a.strides],
            [int(p) for p in a.padding],
            [int(d) for d in a.dilation],
            int(a.groups),
            a.data_layout,
            a.kernel_layout,
            a.out_layout,
            "float32",
        )


# what MixedPrecision counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("mixed_precision_kept", int, "ops kept in float32 under --precision", always=True),
    Counter("mixed_precision_ops", int, "ops converted to the reduced precision", always=True),
)


@tvm.transform.module_pass(opt_level=1, name="MixedPrecision")
class MixedPrecision:
    COUNTERS = COUNTERS

    def __init__(self, precision: str, kernels=frozenset()):
        self.dtype, self.np_dtype = REDUCED_TYPES[precision]
        self.kernels = frozenset(kernels)
        self.stats = {"mixed_precision_ops": 0, "mixed_precision_kept": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        cast = _Cast(mod, self.dtype, self.np_dtype, self.kernels)
        out = rewrite_functions(mod, cast.visit_expr)
        self.stats["mixed_precision_ops"] += cast.converted
        self.stats["mixed_precision_kept"] += cast.kept
        return out
