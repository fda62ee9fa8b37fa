"""Default schedules for the int8 kernels (legalize.conv2d_nchwc_int8, legalize.matmul_int8): the
register tile accumulates over the reduction in int32 with one dot-product instruction per step."""

from __future__ import annotations

from tvm import s_tir

from .rules import _divisor_at_most, extent, inline_all_but, tile_consumers, vectorize_tails


def target_has(feature: str) -> bool:
    """Whether the current target (the `with target:` the pipeline runs in) enables an LLVM feature."""
    import tvm
    from tvm.target import codegen

    t = tvm.target.Target.current(allow_none=True)
    return t is not None and t.kind.name == "llvm" and feature in set(codegen.llvm_get_cpu_features(t))


def _tensorize_vnni(sch: s_tir.Schedule, anchor, reduce_loop, tile_loop, lanes_loop, epilogue: list) -> None:
    """Shared tail of the int8 rules: zero-init outside the reduction, the register tile unrolled,
    the 16x4 inner loops replaced by vpdpbusd, the init and epilogue vectorized by 16."""
    from .intrinsics import VNNI_16x4

    init = sch.decompose_reduction(anchor, reduce_loop)
    sch.unroll(tile_loop)
    sch.tensorize(lanes_loop, VNNI_16x4)
    vectorize_tails(sch, [init, *epilogue], 16)


def conv2d_int8_vnni(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """uint8 x int8 NCHWc conv2d (legalize.conv2d_nchwc_int8): each (16 outputs x 4 inputs) step is
    one vpdpbusd; a row of up to 8 output pixels x 16 channels accumulates in registers over all
    input channels and taps, then the epilogue (requantization) runs on the tile. The input
    prologue (zero-point padding, quantization) is computed per output row."""
    if not target_has("avx512vnni"):
        raise s_tir.ScheduleError("the target has no AVX-512 VNNI")
    if len(sch.get_loops(anchor)) != 10:
        raise s_tir.ScheduleError("not an int8 NCHWc conv")
    prologue = [b for b in sch.get_producers(anchor)]
    inline_all_but(sch, [anchor, *prologue])
    consumers = tile_consumers(sch, anchor)
    n, o, y, x, k, ic, ry, rx, i4o, i4i = sch.get_loops(anchor)
    t = _divisor_at_most(extent(sch, x), 8)
    xo, xi = sch.split(x, [None, t])
    sch.reorder(n, o, y, xo, ic, ry, rx, i4o, xi, k, i4i)
    cache = sch.cache_write(anchor, 0, "global")  # the intrinsic's buffers are global scope
    sch.reverse_compute_at(cache, xo, preserve_unit_loops=True)
    for c in consumers:
        sch.reverse_compute_at(c, xo, preserve_unit_loops=True)
    for p in prologue:
        sch.compute_at(p, y, preserve_unit_loops=True)
    sch.parallel(sch.fuse(n, o, y))
    _tensorize_vnni(sch, anchor, ic, xi, k, [cache, *consumers])
    for p in prologue:
        inner = sch.get_loops(p)[-1]
        if extent(sch, inner) in (4, 8, 16, 32, 64):
            sch.vectorize(inner)


def matmul_int8_vnni(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """uint8 x int8 matmul by packed weights (legalize.matmul_int8): rows x 16 columns accumulate
    in registers over K, 4 at a time (one vpdpbusd per row); epilogue per tile."""
    if not target_has("avx512vnni"):
        raise s_tir.ScheduleError("the target has no AVX-512 VNNI")
    inline_all_but(sch, [anchor, *sch.get_producers(anchor)])
    prologue = sch.get_producers(anchor)
    consumers = tile_consumers(sch, anchor)
    loops = sch.get_loops(anchor)
    *lead, n, ko, ki = loops
    m = sch.fuse(*lead) if len(lead) > 1 else lead[0]
    t = _divisor_at_most(extent(sch, m), 8)
    mo, mi = sch.split(m, [None, t])
    nb, nj = sch.split(n, [None, 16])
    sch.reorder(mo, nb, ko, mi, nj, ki)
    cache = sch.cache_write(anchor, 0, "global")
    sch.reverse_compute_at(cache, nb, preserve_unit_loops=True)
    for c in consumers:
        sch.reverse_compute_at(c, nb, preserve_unit_loops=True)
    for p in prologue:
        sch.compute_at(p, mo, preserve_unit_loops=True)
    sch.parallel(sch.fuse(mo, nb))
    _tensorize_vnni(sch, anchor, ko, mi, nj, [cache, *consumers])
