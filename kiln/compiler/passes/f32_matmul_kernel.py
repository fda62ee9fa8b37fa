"""F32MatmulKernel: on AVX-512 (x86-64 with 32 zmm registers), a float32 matmul by constant weights (a transformer's
projections and MLP, a classifier) runs on Kiln's fp32 C kernel (kiln/schedules/kernels/f32_matmul.c): the weights
packed at compile time into [N/16, K, 16], 6 x 4 or 8 x 3 register tiles of 16-column vectors over all of K, rows
that do not fill a tile on a tile of their own row count, the bias, activation and residual add applied as the
accumulators are stored (FuseBF16MatmulEpilogue fuses them as for the bf16 kernel). TVM's schedule of the same tile
(schedules/rules/matmul.py, with PackDenseWeights) padded ragged row counts to whole tiles and wrote its result to
an intermediate the epilogue read back; at two threads it ran small and ragged GEMMs slower than this kernel
(timings in benchmarks/history.md). The rewrite is BF16MatmulKernel's (bf16_matmul_kernel.take_matmuls, its F32
kernel type); matmuls it does not take (columns not a multiple of 16, weights that are activations, shapes known
only at run time) keep TVM's schedules. `stats["f32_kernel_matmuls"]` counts the matmuls it takes."""

from __future__ import annotations

import tvm

from ...counters import Counter
from .bf16_matmul_kernel import F32, take_matmuls

# what F32MatmulKernel counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("f32_kernel_matmuls", int, "matmuls on Kiln's fp32 matmul kernel (AVX-512)", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="F32MatmulKernel")
class F32MatmulKernel:
    COUNTERS = COUNTERS

    def __init__(self, arch: str = "x86_64"):
        self.arch = arch
        self.stats = {"f32_kernel_matmuls": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = take_matmuls(mod, self.arch, F32)
        self.stats["f32_kernel_matmuls"] += count
        return out


__all__ = ["F32MatmulKernel"]
