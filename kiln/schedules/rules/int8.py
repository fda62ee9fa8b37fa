"""int8 kernels per instruction set, and their default schedules (legalize_int8.conv2d_nchwc_int8,
legalize_int8.matmul_int8): the register tile accumulates over the reduction in int32 with one
dot-product step (schedules/rules/intrinsics.py) per (lanes output channels x 4 inputs).

`int8_kernel(caps)` picks the kernel from the target's capabilities (caps.int8_path); legalization
shapes the int8 computes for it (the output-channel block is its lanes: 16 on zmm, 8 on ymm, 4 on
NEON q registers) and names it in the compute's block annotation, which the rules read: a rule
never looks at the target. Targets with no kernel here keep int8 layers in float (the quantizer
says why): a generic int8 schedule is slower than float32 (benchmarks/history.md)."""

from __future__ import annotations

import dataclasses

from tvm import s_tir

from . import intrinsics as ti
from .matmul import cropping_consumers
from .rules import extent, inline_all_but, parallel_vectorize, tile_consumers, vectorize_tails
from .tiles import divisor_at_most, round_to_tile

ANNOTATION = "kiln.int8_kernel"  # block annotation of the int8 computes: the Int8Kernel's path


@dataclasses.dataclass(frozen=True)
class Int8Kernel:
    """One int8 instruction family: what legalization, the quantizer and the rules need to know."""

    path: str  # the caps.int8_path it serves
    intrin: str  # the tensor intrinsic of one (lanes x 4) step
    lanes: int  # int32 accumulators per vector: the output-channel block of the int8 layouts
    signed_data: bool  # sdot: data shifted to int8 (x - 128), plus a 128 * sum(w) compensation
    weight_max: int  # |w| the quantizer may use: 64 where vpmaddubsw's int16 pair sum saturates beyond
    speedup: float  # peak int8 multiply-adds per float32 FMA lane: the whole-model estimate's ratio
    accumulators: int  # vector registers the register tile may hold (pixels/rows x channel blocks)
    note: str = ""  # what the report says about it


KERNELS = {
    k.path: k
    for k in (
        Int8Kernel(
            "amx-int8", ti.VNNI_16x4, 16, False, 127, 4.0, 16, "AMX tiles (schedules/rules/amx.py); small matmuls VNNI"
        ),
        Int8Kernel("avx512-vnni", ti.VNNI_16x4, 16, False, 127, 4.0, 16),
        Int8Kernel("avx-vnni", ti.AVXVNNI_8x4, 8, False, 127, 4.0, 10),
        Int8Kernel("avx512-pmaddubsw", ti.PMADDUBSW_16x4, 16, False, 64, 2.0, 16, "7-bit weights (vpmaddubsw)"),
        Int8Kernel("avx2-pmaddubsw", ti.PMADDUBSW_8x4, 8, False, 64, 2.0, 8, "7-bit weights (vpmaddubsw)"),
        Int8Kernel("i8mm", ti.USDOT_4x4, 4, False, 127, 4.0, 16),
        Int8Kernel("dotprod", ti.SDOT_4x4, 4, True, 127, 4.0, 16, "data shifted to int8 for sdot"),
    )
}
# int8 paths with no kernel above, and why their int8 layers stay float
NO_KERNEL = {
    "neon-smlal": "no dotprod (sdot/udot): widening multiplies give about float32's rate, so int8 would not be faster",
    "sse-pmaddubsw": "no AVX2: 128-bit vpmaddubsw runs at about 256-bit FMA code's rate, so int8 would not be faster",
    "generic": "no SIMD integer dot product: a generic int8 kernel is slower than float32",
}


# the same instruction on half-width registers, for output-channel counts the full width does not divide:
# AVX512-VL encodes vpdpbusd and vpmaddubsw on ymm, so a 24-channel conv runs 3 blocks of 8 (MobileNetV2)
NARROW = {"avx512-vnni": "avx-vnni", "amx-int8": "avx-vnni", "avx512-pmaddubsw": "avx2-pmaddubsw"}
MIN_CHANNELS = STEP = 4  # input channels per dot-product step; a conv with fewer (a stem) pads up to it


def int8_kernel(caps) -> Int8Kernel | None:
    """The int8 kernel for a target's capabilities (None: int8 layers stay float, see NO_KERNEL)."""
    return KERNELS.get(getattr(caps, "int8_path", None))


def kernel_for_lanes(kernel: Int8Kernel | None, lanes: int) -> Int8Kernel | None:
    """The kernel of `kernel`'s family whose output-channel block is `lanes` (its NARROW sibling), or None."""
    if kernel is None:
        return None
    if lanes == kernel.lanes:
        return kernel
    narrow = KERNELS.get(NARROW.get(kernel.path, ""))
    return narrow if narrow is not None and narrow.lanes == lanes else None


def kernel_for_channels(kernel: Int8Kernel | None, n: int) -> Int8Kernel | None:
    """The kernel of `kernel`'s family whose lanes divide n output channels (columns): itself, else its
    NARROW sibling (a 24-channel conv, a 1000-class head on AVX-512), else None."""
    if kernel is None:
        return None
    return next((k for k in (kernel, kernel_for_lanes(kernel, kernel.lanes // 2)) if k and n % k.lanes == 0), None)


def conv_blocks(kernel: Int8Kernel | None, i: int, o: int) -> tuple[int, int] | None:
    """(input block, output block) of the blocked int8 conv for i -> o channels, or None (no int8 kernel
    fits). The output block is a lane count of the family (16, else 8 on AVX-512); the input block the
    widest power of two up to the output block dividing i, a multiple of 4 (one dot-product step), or 4
    for a conv with fewer than 4 input channels (the stem: zero input channels pad it to one step)."""
    out = kernel_for_channels(kernel, o)
    if out is None:
        return None
    bo = out.lanes
    if i < MIN_CHANNELS:
        return MIN_CHANNELS, bo
    bi = kernel.lanes
    while bi > 1 and i % bi:
        bi //= 2
    return (bi, bo) if bi % STEP == 0 else None


def why_no_kernel(caps) -> str:
    path = getattr(caps, "int8_path", None) or "generic"
    return f"{getattr(caps, 'cpu', 'this target')}: {NO_KERNEL.get(path, NO_KERNEL['generic'])}"


def pairs_may_saturate(wq, in_axis: int) -> bool:
    """Whether vpmaddubsw's int16 sum of two neighbouring input channels' products (uint8 data, any
    value 0..255) can leave [-32768, 32767] for these int8 weights: when the same-signed weights
    of a pair (2j, 2j+1) add up beyond 128 in magnitude (255 * 128 = 32640)."""
    import numpy as np

    w = np.moveaxis(np.asarray(wq, np.int32), in_axis, -1)
    if w.shape[-1] % 2:
        w = np.concatenate([w, np.zeros((*w.shape[:-1], 1), np.int32)], axis=-1)
    pairs = w.reshape(*w.shape[:-1], -1, 2)
    return bool((np.clip(pairs, 0, None).sum(-1) > 128).any() or (np.clip(pairs, None, 0).sum(-1) < -128).any())


def qdq_float_reason(caps, wq, in_axis: int) -> str | None:
    """Why an imported int8 (QDQ) layer with weights wq should run in float on this target (None:
    lower it to the int8 kernel): no int8 kernel faster than float32, or 8-bit weights that would
    saturate vpmaddubsw (its exact alternatives run at float32's rate). GPU targets: None."""
    if not hasattr(caps, "int8_path"):
        return None
    kernel = int8_kernel(caps)
    if kernel is None:
        return why_no_kernel(caps)
    if kernel.weight_max < 127 and pairs_may_saturate(wq, in_axis):
        return f"{kernel.path}: its 8-bit weights could saturate vpmaddubsw's int16 pair sums"
    return None


def _kernel_of(sch: s_tir.Schedule, anchor) -> Int8Kernel:
    ann = sch.get(anchor).annotations.get(ANNOTATION)
    if ann is None or str(ann) not in KERNELS:
        raise s_tir.ScheduleError("the int8 compute names no int8 kernel")
    return KERNELS[str(ann)]


def rounded_rows(rows: int, blocks: int, accumulators: int) -> int | None:
    """The row count an int8 matmul's rows are rounded up to when no divisor of `rows` gives a register tile
    within ROUND_ROWS_GAIN of the best one (ViT's 197 tokens, a prime: 1-row tiles read every weight vector
    per dot product, 48 GOP/s on Zen 4); None when the rows tile well (tiles.round_to_tile, as float32's)."""
    return round_to_tile(rows, lambda m: register_tile(m, blocks, accumulators))


def register_tile(pixels: int | None, blocks: int, accumulators: int) -> tuple[int, int]:
    """(pixels, channel blocks) of a register tile: divisors of the extents (no tails for tensorize),
    at most `accumulators`, with the most dot products per operand loaded (t broadcasts + b weight
    vectors for t x b dot products), then the most accumulators. The weights are read again for every
    tile of pixels: on a 7-wide row the most accumulators, 1 pixel x 16 blocks, streamed ResNet's 2.4 MB
    of 3x3x512x512 weights once per pixel; 7 pixels x 2 blocks ran it several times faster (timings in
    benchmarks/history.md)."""
    best, best_key = (1, 1), (0.0, 0)
    for b in range(1, min(blocks, accumulators) + 1):
        if blocks % b:
            continue
        t = accumulators // b if pixels is None else divisor_at_most(pixels, accumulators // b)  # None: any rows
        key = (t * b / (t + b), t * b)
        if key > best_key:
            best, best_key = (t, b), key
    return best


def _tensorize(
    sch: s_tir.Schedule, kernel: Int8Kernel, anchor, reduce_loop, tile_loops, lanes_loop, epilogue, split=False
) -> None:
    """Shared tail of the int8 rules: zero-init outside the reduction, the register tile unrolled,
    the (lanes x 4) inner loops replaced by the kernel's intrinsic, init and epilogue vectorized
    (split: epilogues whose innermost loop spans several blocks of lanes, split into vectors)."""
    init = sch.decompose_reduction(anchor, reduce_loop)
    for loop in tile_loops:
        sch.unroll(loop)
    sch.tensorize(lanes_loop, kernel.intrin)
    vectorize_tails(sch, [init, *epilogue], kernel.lanes, split=split)


def conv2d_int8(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """int8 NCHWc conv2d (legalize_int8.conv2d_nchwc_int8): each (lanes outputs x 4 inputs) step is
    one dot-product step; a tile of output pixels x channel blocks (register_tile) accumulates in
    registers over all input channels and taps, then the epilogue (requantization) runs on the
    tile. The input prologue (zero-point padding, the sdot shift) is computed per output row."""
    kernel = _kernel_of(sch, anchor)
    if len(sch.get_loops(anchor)) != 10:
        raise s_tir.ScheduleError("not an int8 NCHWc conv")
    prologue = list(sch.get_producers(anchor))
    inline_all_but(sch, [anchor, *prologue])
    consumers = tile_consumers(sch, anchor)
    n, o, y, x, k, ic, ry, rx, i4o, i4i = sch.get_loops(anchor)
    if extent(sch, k) != kernel.lanes:
        raise s_tir.ScheduleError(f"output block {extent(sch, k)}, the {kernel.path} kernel takes {kernel.lanes}")
    t, b = register_tile(extent(sch, x), extent(sch, o), kernel.accumulators)
    oo, oi = sch.split(o, [None, b])
    xo, xi = sch.split(x, [None, t])
    sch.reorder(n, oo, y, xo, ic, ry, rx, i4o, oi, xi, k, i4i)
    cache = sch.cache_write(anchor, 0, "global")  # the intrinsic's buffers are global scope
    sch.reverse_compute_at(cache, xo, preserve_unit_loops=True)
    for c in consumers:
        sch.reverse_compute_at(c, xo, preserve_unit_loops=True)
    for p in prologue:
        sch.compute_at(p, y, preserve_unit_loops=True)
    sch.parallel(sch.fuse(n, oo, y))
    _tensorize(sch, kernel, anchor, ic, [oi, xi], k, [cache, *consumers])
    for p in prologue:
        inner = sch.get_loops(p)[-1]
        if extent(sch, inner) in (4, 8, 16, 32, 64):
            sch.vectorize(inner)


def matmul_int8(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """int8 matmul by packed weights (legalize_int8.matmul_int8): a tile of rows x column blocks
    (register_tile: a batch-1 row gets several independent column accumulators) accumulates in
    registers over K, 4 at a time; epilogue per tile. A prologue (the sdot shift) runs once over
    the whole input first."""
    kernel = _kernel_of(sch, anchor)
    inline_all_but(sch, [anchor, *sch.get_producers(anchor)])
    prologue = sch.get_producers(anchor)
    consumers = tile_consumers(sch, anchor) + cropping_consumers(sch, anchor)
    for c in sch.get_consumers(anchor):  # the epilogue of a slice of padded columns stays at the root:
        if c not in consumers:  # vectorize_leftovers cannot copy a tensorized schedule, so it is done here
            parallel_vectorize(sch, c, kernel.lanes)
    # the row tile comes from the last row axis; the leading ones ([batch, seq, K] inputs) stay outer
    # loops: fused with it, their div/mod bindings would not blockize for tensorize. A unit last row axis
    # ([T, 1, K]: a recurrence's steps, a CTC head's frames) fuses with the one before it: no div/mod then.
    *outer, m, n, ko, ki = sch.get_loops(anchor)
    if extent(sch, m) == 1 and outer:
        *outer, m = *outer[:-1], sch.fuse(outer[-1], m)
    rows, cols = extent(sch, m), extent(sch, n)
    t, b = register_tile(rows, cols // kernel.lanes, kernel.accumulators)
    mo, mi = sch.split(m, [None, t])
    nbo, nbi, nj = sch.split(n, [None, b, kernel.lanes])
    # weights larger than the rows: each column block's weights stay in cache across the row tiles
    # (ddddocr's 20 x 1024 x 8210 head streamed its 8.4 MB of weights once per row tile)
    tiles = (nbo, mo) if cols > rows else (mo, nbo)
    sch.reorder(*outer, *tiles, ko, mi, nbi, nj, ki)
    cache = sch.cache_write(anchor, 0, "global")
    sch.reverse_compute_at(cache, tiles[1], preserve_unit_loops=True)
    for c in consumers:
        sch.reverse_compute_at(c, tiles[1], preserve_unit_loops=True)
    sch.parallel(sch.fuse(*outer, *tiles))
    _tensorize(sch, kernel, anchor, ko, [mi, nbi], nj, [cache, *consumers], split=True)
    for p in prologue:  # the sdot shift: once over the whole input, ahead of the tiles (a few rows)
        parallel_vectorize(sch, p, 16)
