"""PackDenseWeights: a float32 matmul of a few rows (a classifier: [1, K] x [K, N]) by constant
weights reads every weight once, from memory, so its speed is the memory system's. Its default
schedule takes a tile of columns at a time, and each tile reads a narrow strip of every weight row
(160 of ResNet-50's 4000-byte rows), which memory delivers well below its bandwidth. Packed at
compile time into [N/b, K, b], each tile reads contiguous streams, at the bandwidth the cores get.
The same holds at any row count when the weights are past a core's L2 (STREAMED_BYTES): the strips then
come from L3 or DRAM for every row tile (ConvNeXt-T's last stage, 9 tokens x [768, 3072]; a [512, 768] x
[768, 3072] matmul; Whisper's 1500 frames x [1536, 384], whose unpacked [K, N] rows are 1536 bytes apart).
The same results bit for bit (same summation order); timings in benchmarks/history.md.
FuseEpilogue fuses the bias after it like after a matmul. `stats["dense_packed"]` counts them.

A matmul whose row count is known only at run time (a detector's box head over the RoIs it kept) is
packed too, by the dynamic rule's column tile (v vectors: dynamic_tile), the columns padded to a whole
tile and sliced off after: FasterRCNN's fc6 ([<=150, 12544] x [12544, 1024]) read each 16-float weight
vector from a different 4 KB page, one TLB miss per step of the reduction, and its 91-column
classifier ran scalar (timings in benchmarks/history.md). `stats["dense_packed_dynamic"]` counts those.

A matmul of two or more rows, not packed, whose column count has no vector width of 4 or more (ddddocr's 8210-character
classifier, an enhancer's 129 frequency bins) gets its constant weights padded with zero columns to a whole
number of vectors here, once, and a slice of the real columns after it; the matmul schedule would otherwise
pad them each call (33.6 MB for ddddocr's). `stats["dense_padded"]` counts them.

A matmul of static rows by constant weights whose row count has no divisor that makes a good register tile
(ViT-B's 197 tokens, a prime: 1-row tiles, far below peak) is packed and computed over the rows rounded up to
the best tile's (198 = 33 x 6), the padding rows reading the last real row, and cropped in the same kernel
(the epilogue runs per tile, predicated on the real rows). `stats["dense_rows_rounded"]` counts them.

On AVX-512 targets F32MatmulKernel runs before this pass and takes the static float32 matmuls whose columns are a
multiple of 16; this pass packs what it leaves (and everything on other targets)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ...schedules.rules.dynamic import dynamic_tile
from ...schedules.rules.kinds import declare
from ...schedules.rules.tiles import rounded_rows
from ..ir import register_kernel
from .convert_layout import widest_block
from .counting import static_shape
from .module_map import rewrite_calls

PRIMFUNC = register_kernel("matmul_packed", "matmul_packed")  # the kernels' name hint (FuseEpilogue anchors on it)
MAX_ROWS = 4  # more rows reuse each weight from cache: the plain matmul schedule is the better one ...
# ... unless the weights are past a core's L2: then its column strips stream from L3 or DRAM at any row count
# (packed was faster at every row count measured, 1 to 4096; no faster for weights within L2: benchmarks/history.md)
STREAMED_BYTES = 1 << 20
MIN_BLOCK = 8  # narrower column tiles are not worth a packed layout
MAX_PAD = 0.125  # run-time-row matmuls: the share of padded columns a wider tile may cost


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


def matmul_packed_rows(x, packed, n: int, rows: int):
    """float32 [M, K] x [N'/b, K, b] -> [M, n] for a run-time M: the product is computed over M rounded up
    to a whole number of `rows` (the register tile's rows, the dynamic rule's split), reading row M-1 for
    the padding rows, so the tile needs no predicate and its accumulators stay in registers (with a
    predicated tail they were a run-time-sized buffer in memory: a load and a store per FMA). A copy
    takes the first M rows and n columns."""
    nb, k, b = packed.shape
    m = x.shape[0]
    r = te.reduce_axis((0, k), name="k")
    full = te.compute(
        ((m + rows - 1) // rows * rows, nb * b),
        lambda i, j: te.sum(x[te.min(i, m - 1), r] * packed[j // b, r, j % b], axis=[r]),
        name="matmul_packed",
        attrs=declare("matmul"),
    )
    return te.compute((m, n), lambda i, j: full[i, j], name="matmul_rows")


def matmul_packed_padded(x, packed, n: int, rows: int):
    """float32 [..., M, K] x [N'/b, K, b] -> [..., M, n] for a static M that tiles badly: computed over `rows`
    (M rounded up to the register tile's rows, tiles.rounded_rows), the padding rows reading row M-1, then
    cropped to M rows and n columns, so every tile is a full register tile."""
    nb, k, b = packed.shape
    m = int(x.shape[-2])
    r = te.reduce_axis((0, k), name="k")
    lead = tuple(x.shape[:-2])
    full = te.compute(
        (*lead, rows, nb * b),
        lambda *i: te.sum(x[(*i[:-2], te.min(i[-2], m - 1), r)] * packed[i[-1] // b, r, i[-1] % b], axis=[r]),
        name="matmul_packed",
        attrs=declare("matmul"),
    )
    return te.compute((*lead, m, n), lambda *i: full[i], name="matmul_rows")


def ragged_rows(call, block: int, registers: int) -> tuple[int, int] | None:
    """(b, rows) for a float32 matmul of static rows by constant [K, N] weights whose row count has no divisor
    that makes a good register tile (197 tokens): the column tile width and the rows rounded up
    (tiles.rounded_rows); else None."""
    x_shape = static_shape(call.args[0]) if float_matmul_by_constant(call) else None
    if x_shape is None or len(x_shape) < 2:
        return None
    n = int(call.args[1].value.shape[1])
    b = widest_block(n, block)
    rows = rounded_rows(x_shape[-2], n // b, registers) if b >= MIN_BLOCK else None
    return None if rows is None else (b, rows)


def float_matmul_by_constant(call) -> bool:
    """A float32 relax.matmul whose second operand is a constant [K, N] matrix: what each rewrite here takes."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.matmul":
        return False
    w = call.args[1]
    return (
        isinstance(w, GenericConst)
        and len(w.value.shape) == 2
        and str(call.args[0].ty.dtype) == "float32"
        and str(w.value.dtype) == "float32"
        and str(call.ty.dtype) == "float32"
    )


def column_block(call, block: int) -> int | None:
    """The column tile width b for this call (the widest power of two up to the vector block that
    divides N: the width the matmul schedule vectorizes by), or None when it is not a packable matmul."""
    x_shape = static_shape(call.args[0]) if float_matmul_by_constant(call) else None
    if x_shape is None:
        return None
    w = call.args[1]
    rows, nbytes = int(np.prod(x_shape[:-1])), int(np.prod(w.value.shape)) * 4
    if rows > MAX_ROWS and nbytes < STREAMED_BYTES:
        return None
    b = widest_block(int(w.value.shape[1]), block)
    return b if b >= MIN_BLOCK else None


def dynamic_column_tile(call, lanes: int, registers: int) -> tuple[int, int, int] | None:
    """(b, padded N, rows) for a float32 matmul by constant [K, N] weights whose rows are known only at run time:
    the output width, at most MAX_PAD wider than N, whose register tile (dynamic_tile, which the dynamic
    rule will pick for that width) does the most FMAs per load, and that tile's width b; else None."""
    if not float_matmul_by_constant(call) or static_shape(call.args[0]) is not None or call.args[0].ty.ndim != 2:
        return None
    n = int(call.args[1].value.shape[1])
    best, best_key = None, 0.0
    for vectors in range(-(-n // lanes), int(n * (1 + MAX_PAD)) // lanes + 1):
        r, v = dynamic_tile(vectors, registers)
        if r * v / (r + v) > best_key:
            best, best_key = (v * lanes, vectors * lanes, r), r * v / (r + v)
    return best


def padded_columns(call, block: int) -> int | None:
    """N rounded up to the vector block for a float32 matmul of two or more static rows by constant [K, N]
    weights whose N has no vector width of 4 or more (and that _to_packed did not take); else None."""
    x_shape = static_shape(call.args[0]) if float_matmul_by_constant(call) else None
    if x_shape is None or int(np.prod(x_shape[:-1])) < 2:
        return None
    n = int(call.args[1].value.shape[1])
    return -(-n // block) * block if n > block and widest_block(n, block) < 4 else None


def _padded(builder, call, block: int):
    padded = padded_columns(call, block)
    if padded is None:
        return None
    w = call.args[1].value.numpy()
    k, n = w.shape
    wide = relax.const(np.concatenate([w, np.zeros((k, padded - n), w.dtype)], axis=1))
    y = builder.emit(relax.op.matmul(call.args[0], wide))
    return relax.op.strided_slice(y, axes=[call.ty.ndim - 1], begin=[0], end=[n])


def _to_packed(builder, call, block: int, registers: int, ragged: tuple[int, int] | None):
    """The packed matmul for `call`, or None; ragged: its ragged_rows (b, rows), computed once by the caller."""
    b, rows = column_block(call, block), None
    if ragged is not None:
        b, rows = ragged
        padded = int(call.args[1].value.shape[1])
    elif b is not None:
        padded = int(call.args[1].value.shape[1])
    else:
        tile = dynamic_column_tile(call, block, registers)
        if tile is None:
            return None
        b, padded, rows = tile
    w = call.args[1].value.numpy()
    k, n = w.shape
    if padded != n:
        w = np.concatenate([w, np.zeros((k, padded - n), w.dtype)], axis=1)
    packed = tvm.relax.const(np.ascontiguousarray(w.reshape(k, padded // b, b).transpose(1, 0, 2)), "float32")
    if ragged is not None:
        return builder.call_te(matmul_packed_padded, call.args[0], packed, n, rows, primfunc_name_hint=PRIMFUNC)
    if rows is not None:  # rows known at run time
        return builder.call_te(matmul_packed_rows, call.args[0], packed, n, rows, primfunc_name_hint=PRIMFUNC)
    return builder.call_te(matmul_packed, call.args[0], packed, primfunc_name_hint=PRIMFUNC)


def _folded_transpose(call, lookup):
    """matmul(x, W^T) with W^T a transpose of a constant TVM's FoldConstant left (outside a dataflow
    block: a box head after NonZero), as matmul(x, constant)."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.matmul" or not isinstance(call.args[1], relax.Var):
        return call
    v = lookup(call.args[1])
    if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.permute_dims"):
        return call
    w = v.args[0]
    axes = v.attrs.axes
    if (
        not isinstance(w, GenericConst)
        or len(w.value.shape) != 2
        or (axes is not None and [int(a) for a in axes] != [1, 0])
    ):
        return call
    return relax.Call(call.op, [call.args[0], relax.const(np.ascontiguousarray(w.value.numpy().T))], call.attrs)


# what PackDenseWeights counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("dense_packed", int, "dense weights packed for the matmul kernel", always=True),
    Counter("dense_packed_dynamic", int, "dense weights packed for a dynamic-shape matmul"),
    Counter("dense_padded", int, "dense weights padded to the block", always=True),
    Counter("dense_rows_rounded", int, "matmuls computed over rows rounded up to the register tile", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="PackDenseWeights")
class PackDenseWeights:
    COUNTERS = COUNTERS

    def __init__(self, block: int, registers: int = 16):
        self.block, self.registers = block, registers
        self.stats = {"dense_packed": 0, "dense_packed_dynamic": 0, "dense_padded": 0, "dense_rows_rounded": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        dynamic, padded = [], []

        def pack(builder, call, lookup):
            folded = _folded_transpose(call, lookup)
            call = call if folded is call else builder.normalize(folded)
            ragged = ragged_rows(call, self.block, self.registers)
            self.stats["dense_rows_rounded"] += ragged is not None
            new = _to_packed(builder, call, self.block, self.registers, ragged)
            if new is not None and static_shape(call.args[0]) is None:
                dynamic.append(call)
            if new is None:
                new = _padded(builder, call, self.block)
                if new is not None:
                    padded.append(call)
            return new

        out, count = rewrite_calls(mod, pack, lookup=True)
        self.stats["dense_packed"] += count - len(dynamic) - len(padded)
        self.stats["dense_padded"] += len(padded)
        self.stats["dense_packed_dynamic"] += len(dynamic)
        return out


__all__ = ["PackDenseWeights"]
