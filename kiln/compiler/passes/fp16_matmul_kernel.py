"""FP16MatmulKernel: with --precision fp16 on arm64 with fp16 arithmetic (fullfp16: Graviton2/3, Cortex-A76 and
later), a float32 matmul by constant weights runs on Kiln's fp16 C kernel (kiln/schedules/kernels/
fp16_matmul_arm.c): fmla .8h into fp16 partial sums over 16 inputs, added to float32 accumulators, the weights
converted to fp16 and packed at compile time into [N/16, 2, K, 8], the activations cast to fp16 by their producer.
Without it TVM computes an fp16 matmul that accumulates in float32 by widening both operands (fcvtl) and fp32
fmla .4s, no faster than float32. The rewrite is BF16MatmulKernel's (bf16_matmul_kernel.take_matmuls, its FP16
kernel type), and FuseBF16MatmulEpilogue fuses its epilogues the same way. `stats["fp16_kernel_matmuls"]` counts
the matmuls it takes."""

from __future__ import annotations

import tvm

from ...counters import Counter
from .bf16_matmul_kernel import FP16, take_matmuls

# what FP16MatmulKernel counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("fp16_kernel_matmuls", int, "matmuls on Kiln's fp16 matmul kernel (arm64 fmla .8h)", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="FP16MatmulKernel")
class FP16MatmulKernel:
    COUNTERS = COUNTERS

    def __init__(self, arch: str = "aarch64"):
        self.arch = arch
        self.stats = {"fp16_kernel_matmuls": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = take_matmuls(mod, self.arch, FP16)
        self.stats["fp16_kernel_matmuls"] += count
        return out


__all__ = ["FP16MatmulKernel"]
