"""PackDenseWeights: a float32 matmul of a few rows (a classifier: [1, K] x [K, N]) by constant
weights reads every weight once, from memory, so its speed is the memory system's. Its default
schedule takes a tile of columns at a time, and each tile reads a narrow strip of every weight row
(160 of ResNet-50's 4000-byte rows), which memory delivers well below its bandwidth. Packed at
compile time into [N/b, K, b], each tile reads contiguous streams, at the bandwidth the cores get.
The same results bit for bit (same summation order); timings in benchmarks/history.md.
FuseEpilogue fuses the bias after it like after a matmul. `stats["dense_packed"]` counts them."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te
from tvm.ir.expr import GenericConst

from ...schedules.kinds import declare
from ..ir import register_kernel
from .convert_layout import widest_block
from .counting import static_shape
from .module_map import rewrite_calls

PRIMFUNC = register_kernel("matmul_packed", "matmul_packed")  # the kernels' name hint (FuseEpilogue anchors on it)
MAX_ROWS = 4  # more rows reuse each weight from cache: the plain matmul schedule is the better one
MIN_BLOCK = 8  # narrower column tiles are not worth a packed layout


def matmul_packed(x, packed):
    """float32 [..., K] x [N/b, K, b] -> [..., N]."""
    nb, k, b = packed.shape
    r = te.reduce_axis((0, k), name="k")
    return te.compute(
        (*x.shape[:-1], nb * b),
        lambda *i: te.sum(x[(*i[:-1], r)] * packed[i[-1] // b, r, i[-1] % b], axis=[r]),
        name="matmul_packed",
        attrs=declare("matmul"),
    )


def column_block(call, block: int) -> int | None:
    """The column tile width b for this call (the widest power of two up to the vector block that
    divides N: the width the matmul schedule vectorizes by), or None when it is not a packable matmul."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.matmul":
        return None
    w = call.args[1]
    x_shape = static_shape(call.args[0])
    if (
        not isinstance(w, GenericConst)
        or x_shape is None
        or len(w.value.shape) != 2
        or str(call.args[0].ty.dtype) != "float32"
        or str(w.value.dtype) != "float32"
        or str(call.ty.dtype) != "float32"
        or int(np.prod(x_shape[:-1])) > MAX_ROWS
    ):
        return None
    b = widest_block(int(w.value.shape[1]), block)
    return b if b >= MIN_BLOCK else None


def _to_packed(builder, call, block: int):
    b = column_block(call, block)
    if b is None:
        return None
    w = call.args[1].value.numpy()
    k, n = w.shape
    packed = np.ascontiguousarray(w.reshape(k, n // b, b).transpose(1, 0, 2))
    return builder.call_te(matmul_packed, call.args[0], tvm.relax.const(packed, "float32"), primfunc_name_hint=PRIMFUNC)


@tvm.transform.module_pass(opt_level=2, name="PackDenseWeights")
class PackDenseWeights:
    def __init__(self, block: int):
        self.block = block
        self.stats = {"dense_packed": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(mod, lambda builder, call: _to_packed(builder, call, self.block))
        self.stats["dense_packed"] += count
        return out


__all__ = ["PackDenseWeights"]
