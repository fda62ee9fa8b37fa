"""AMX-INT8 (Intel Sapphire/Emerald/Granite Rapids): int8 conv2d as one small GEMM per output row
(per map, where a map is small: legalize_amx.row_tasks) on the tile unit, `tdpbusd` (u8 x s8 -> int32) on
1 KiB tile registers.

The compute (legalize_int8.conv2d_amx) gathers each output row's input patches into a row-major
[pixels, K] uint8 buffer (K = KH * KW * C padded to 64; an im2col of one row only, in L1/L2) and
multiplies it by the weights packed as AMX's B operand ([O/16, K/4, 16, 4]: one 64-byte tile row
per 4 inputs of 16 output channels). The rule below computes that row in place by one tensor
intrinsic per row (`gemm_intrin`): a hand-written TIR kernel that configures the tiles
(`ldtilecfg`), starts up to 4 accumulator tiles of 16 pixels x 16 channels from zero (`tilezero`), keeps them
in tile registers over all of K, and stores them once; the requantization epilogue then runs on the row, still
in cache.

Why this shape and not tensorized `vpdpbusd`-style steps: a tile's A operand is 16 rows of 64
contiguous bytes, and NCHW16c data has only 16 contiguous channels per pixel, so a direct conv
would feed `tdpbusd` a quarter of its width; the row gather makes every A row a full 64 bytes.

A process must ask Linux for the tile state before its first tile instruction (arch_prctl
ARCH_REQ_XCOMP_PERM): kiln.runtime.hostinfo.enable_amx, called when an artifact that needs
amx-tile loads."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as B

from .kinds import ATTR
from .rules import extent, inline_all_but, parallel_vectorize, vectorize_tails
from .tvmscript import cheap_stack

ROWS = 16  # tile rows: pixels of A and C, groups of 4 inputs of B
ROW_BYTES = 64  # bytes per tile row: 64 u8 inputs (A), 16 int32 channels (C), 16 x 4 int8 (B)
K_STEP = ROW_BYTES  # inputs per tdpbusd
CHANNELS = ROW_BYTES // 4  # output channels per C tile: the int8 layout's lane block on AMX targets
TILES = 8  # tmm0..tmm7
MIN_TASKS = 8  # parallel tasks (images x row tasks x channel groups) a conv is split into where its channels allow
TILE_ROWS_ATTR = "kiln.amx_rows"  # a compute's annotation: pixels per tile of a whole map in one task (row_tasks)
# the patch's annotation: [taps, channel blocks] of a row with no K padding; _split_runs splits its run loop by them,
# so each 16-byte copy's source is loop variables times strides (a flat loop divided and took remainders per copy:
# half the time of ResNet-18's 64-channel 3x3 convs; benchmarks/history.md)
RUNS_ATTR = "kiln.amx_runs"
# (pixel tiles, channel tiles) held at once: C tiles + A tiles + B tiles <= 8; most dot products per load first
BLOCKINGS = ((2, 2), (1, 3), (3, 1), (1, 2), (2, 1), (1, 1))


def pixel_rows(width: int) -> tuple[int, int]:
    """(padded row width, rows per tile) for an output row of `width` pixels: rows of 16 pixels,
    the last padded; a row of at most 16 pixels is one tile of exactly that many rows."""
    if width <= ROWS:
        return width, width
    return -(-width // ROWS) * ROWS, ROWS


def blocking(pixel_tiles: int, channel_tiles: int) -> tuple[int, int]:
    """The register blocking (bm pixel tiles x bn channel tiles) of gemm_intrin: divisors only."""
    for bm, bn in BLOCKINGS:
        if pixel_tiles % bm == 0 and channel_tiles % bn == 0:
            return bm, bn
    return 1, 1


def _call(name: str, *args):
    return B.evaluate(tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args))


def _i8(v: int):
    return tirx.const(v, "int8")


def _config(cfg, rows: int, first_b: int) -> None:
    """The 64-byte tile configuration: palette 1; C and A tiles (below first_b) `rows` x 64 bytes, B
    tiles 16 x 64; unused bytes zero (reserved)."""
    with B.serial(0, 64) as i:
        B.buffer_store(cfg, tirx.const(0, "uint8"), [i])
    B.buffer_store(cfg, tirx.const(1, "uint8"), [0])
    for t in range(TILES):
        B.buffer_store(cfg, tirx.const(ROW_BYTES, "uint8"), [16 + 2 * t])
        B.buffer_store(cfg, tirx.const(ROWS if t >= first_b else rows, "uint8"), [48 + t])


def _desc(width: int, k: int, nb: int):
    """C[1, nb, 1, width, 16] += A[1, 1, width, k] (u8) . B[nb, k/4, 16, 4] (s8), in int32. One channel
    tile (nb 1) has no channel loop: blockize drops a unit loop from the block it tensorizes."""
    if nb == 1:
        return _desc_one(width, k)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (1, 1, width, k), "uint8", offset_factor=1)
        B = T.match_buffer(b, (nb, k // 4, CHANNELS, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (1, nb, 1, width, CHANNELS), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0, 0:nb, 0, 0:width, 0:CHANNELS], A[0, 0, 0:width, 0:k], B[0:nb, 0 : k // 4, 0:CHANNELS, 0:4])
            T.writes(C[0, 0:nb, 0, 0:width, 0:CHANNELS])
            for o, p, j, k4, t in T.grid(nb, width, CHANNELS, k // 4, 4):
                with T.sblock("update"):
                    vo, vp, vj, vk, vt = T.axis.remap("SSSRR", [o, p, j, k4, t])
                    C[0, vo, 0, vp, vj] = C[0, vo, 0, vp, vj] + T.cast(A[0, 0, vp, vk * 4 + vt], "int32") * T.cast(
                        B[vo, vk, vj, vt], "int32"
                    )

    return desc


def _desc_one(width: int, k: int):
    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (1, 1, width, k), "uint8", offset_factor=1)
        B = T.match_buffer(b, (1, k // 4, CHANNELS, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (1, 1, 1, width, CHANNELS), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0, 0, 0, 0:width, 0:CHANNELS], A[0, 0, 0:width, 0:k], B[0, 0 : k // 4, 0:CHANNELS, 0:4])
            T.writes(C[0, 0, 0, 0:width, 0:CHANNELS])
            for p, j, k4, t in T.grid(width, CHANNELS, k // 4, 4):
                with T.sblock("update"):
                    vp, vj, vk, vt = T.axis.remap("SSRR", [p, j, k4, t])
                    C[0, 0, 0, vp, vj] = C[0, 0, 0, vp, vj] + T.cast(A[0, 0, vp, vk * 4 + vt], "int32") * T.cast(
                        B[0, vk, vj, vt], "int32"
                    )

    return desc


def _impl(width: int, rows: int, k: int, nb: int):
    """The tile kernel for one row: for each (bm x bn) block of Cb tiles, load them, accumulate over
    K in 64-input steps (bm Ab tiles, bn Bb tiles, bm * bn tdpbusd), store them."""
    mt, kc = width // rows, k // K_STEP
    bm, bn = blocking(mt, nb)
    svars = [tirx.Var(f"s{i}", "int32") for i in range(10)]
    with IRBuilder() as ib:
        with B.prim_func(s_tir=True):
            B.func_name("impl")
            a, b, c = B.arg("a", B.handle()), B.arg("b", B.handle()), B.arg("c", B.handle())
            Ab = B.match_buffer(a, (1, 1, width, k), "uint8", strides=[*svars[0:3], 1], offset_factor=1)
            Bb = B.match_buffer(b, (nb, k // 4, CHANNELS, 4), "int8", strides=[*svars[3:6], 1], offset_factor=1)
            Cb = B.match_buffer(c, (1, nb, 1, width, CHANNELS), "int32", strides=[*svars[6:10], 1], offset_factor=1)
            with B.sblock("root"):
                B.reads(
                    Cb[0, 0:nb, 0, 0:width, 0:CHANNELS], Ab[0, 0, 0:width, 0:k], Bb[0:nb, 0 : k // 4, 0:CHANNELS, 0:4]
                )
                B.writes(Cb[0, 0:nb, 0, 0:width, 0:CHANNELS])
                cfg = B.alloc_buffer((64,), "uint8", scope="local")
                _config(cfg, rows, bm * bn + bm)
                _call("ldtilecfg", tirx.address_of(cfg[0]))
                a_stride = tirx.Cast("int64", Ab.strides[2])
                b_stride = tirx.Cast("int64", Bb.strides[1])
                c_stride = tirx.Cast("int64", Cb.strides[3] * 4)
                with B.serial(0, mt // bm) as mo:
                    with B.serial(0, nb // bn) as no:
                        tiles = [(i, j, i * bn + j) for i in range(bm) for j in range(bn)]
                        c_at = [tirx.address_of(Cb[0, no * bn + j, 0, (mo * bm + i) * rows, 0]) for i, j, _ in tiles]
                        for _, _, t in tiles:  # zero_intrin left C to this: C = A . B over all of K
                            _call("tilezero", _i8(t))
                        with B.serial(0, kc) as kk:
                            for i in range(bm):
                                a_at = tirx.address_of(Ab[0, 0, (mo * bm + i) * rows, kk * K_STEP])
                                _call("tileloadd64", _i8(bm * bn + i), a_at, a_stride)
                            for j in range(bn):
                                b_at = tirx.address_of(Bb[no * bn + j, kk * ROWS, 0, 0])
                                _call("tileloadd64", _i8(bm * bn + bm + j), b_at, b_stride)
                            for i, j, t in tiles:
                                _call("tdpbusd", _i8(t), _i8(bm * bn + i), _i8(bm * bn + bm + j))
                        for (_, _, t), at in zip(tiles, c_at):
                            _call("tilestored64", _i8(t), at, c_stride)
                _call("tilerelease")
    return ib.get()


def _zero_desc(width: int, nb: int, impl: bool):
    """C[1, nb, 1, width, 16] = 0, the reduction's init (impl: nothing; the GEMM's tiles start from tilezero)."""

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (1, nb, 1, width, CHANNELS), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0, 0:nb, 0, 0:width, 0:CHANNELS])
            if impl:
                T.evaluate(0)
            else:
                for o, p, j in T.grid(nb, width, CHANNELS):
                    with T.sblock("init"):
                        vo, vp, vj = T.axis.remap("SSS", [o, p, j])
                        C[0, vo, 0, vp, vj] = 0

    return desc


def zero_intrin(width: int, nb: int) -> str:
    """The init of gemm_intrin's reduction, which its tile kernel does itself (tilezero): the row's int32 zeros
    were a memset of up to 64 KB a row (3.7% of ResNet-50 int8's run). Its empty body is right because every
    gemm_intrin call covers all of K for exactly the region this init covers, right after it."""
    name = f"kiln_amx_zero_w{width}n{nb}"
    if s_tir.TensorIntrin.get(name, allow_missing=True) is None:
        with cheap_stack():
            s_tir.TensorIntrin.register(name, _zero_desc(width, nb, False), _zero_desc(width, nb, True))
    return name


def gemm_intrin(width: int, rows: int, k: int, nb: int) -> str:
    """The tensor intrinsic computing one output row (`width` pixels, tiles of `rows`) of `nb` channel
    blocks over K = k inputs; registered once per shape."""
    name = f"kiln_amx_gemm_w{width}r{rows}k{k}n{nb}"
    if s_tir.TensorIntrin.get(name, allow_missing=True) is None:
        with cheap_stack():  # TVMScript's per-frame module lookups otherwise (tvmscript.py)
            s_tir.TensorIntrin.register(name, _desc(width, k, nb), _impl(width, rows, k, nb))
    return name


def _map_pixels(ow: int):
    """The index map of an output [N, O/b, OH, OW, b] onto a whole-map task's [N, O/b, 1, OH * OW, b] (its 0 as
    yy * 0: transform_block_layout takes expressions only)."""
    return lambda i, oc, yy, xx, jj: (i, oc, yy * 0, yy * ow + xx, jj)


def _split_runs(sch: s_tir.Schedule, patch, chunk: int) -> None:
    """The patch's loop over its runs of `chunk` bytes as (tap, channel block) loops (RUNS_ATTR)."""
    runs = sch.get(patch).annotations.get(RUNS_ATTR)
    loops = sch.get_loops(patch)
    if runs is None or len(loops) < 2 or extent(sch, loops[-1]) != chunk:
        return
    taps, blocks_ = (int(v) for v in runs)
    if extent(sch, loops[-2]) == taps * blocks_ and taps > 1 and blocks_ > 1:
        sch.split(loops[-2], [taps, blocks_])


def conv2d_amx(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """int8 conv2d on AMX (legalize_int8.conv2d_amx): parallel over images, channel groups and output
    rows; per row the patch gather (vectorized over 16 channels), the tile GEMM, then the epilogue."""
    if len(sch.get_loops(anchor)) != 7:
        raise s_tir.ScheduleError("not an AMX int8 conv")
    prologue = list(sch.get_producers(anchor))
    pads = [q for p in prologue for q in sch.get_producers(p) if sch.get(q).name_hint.startswith("amx_pad")]
    inline_all_but(sch, [anchor, *prologue, *pads])
    consumers = list(sch.get_consumers(anchor))
    n, o, y, p, j, k4, t = sch.get_loops(anchor)
    notes = sch.get(anchor).annotations
    kind = str(notes[ATTR])
    width, k = extent(sch, p), extent(sch, k4) * 4
    whole_map = TILE_ROWS_ATTR in notes  # legalize_amx.row_tasks: the map in one task
    rows = int(notes.get(TILE_ROWS_ATTR, width if width <= ROWS else ROWS))
    blocks = extent(sch, o)
    groups = 1  # channel groups, of two blocks or more: at least MIN_TASKS tasks where the channels allow
    while extent(sch, n) * extent(sch, y) * groups < MIN_TASKS and blocks % (2 * groups) == 0 and blocks >= 4 * groups:
        groups *= 2
    oo, oi = sch.split(o, [groups, blocks // groups])
    sch.reorder(n, oo, y, oi, p, j, k4, t)
    at_root = []
    for c in consumers:
        try:
            if whole_map:  # its [OH, OW] as the task's pixels: moved with its own loops, TVM 0.27 took a wrong
                # region (a 7x7 map in 52 pixels: its first 3 columns)
                sch.transform_block_layout(c, _map_pixels(extent(sch, sch.get_loops(c)[3])))
            sch.reverse_compute_at(c, y, preserve_unit_loops=True)
        except (s_tir.ScheduleError, ValueError):  # TVM raises ValueError where an 8-channel output's index
            at_root.append(c)  # mixes two of its loops: it stays at the root, reading the whole int32 result
    for q in prologue:
        sch.compute_at(q, y, preserve_unit_loops=True)
    for q in pads:
        sch.compute_at(q, y, preserve_unit_loops=True)
    sch.parallel(sch.fuse(n, oo, y))
    init = sch.decompose_reduction(anchor, oi)
    sch.tensorize(oi if blocks // groups > 1 else p, gemm_intrin(width, rows, k, blocks // groups))
    zero = sch.blockize(sch.get_loops(init)[-3 if blocks // groups > 1 else -2])
    sch.tensorize(zero, zero_intrin(width, blocks // groups))
    sch.annotate(zero, ATTR, kind)  # the kernel's kind, which the init block carried and blockize dropped
    vectorize_tails(sch, pads, CHANNELS, split=True)
    for q in prologue:  # the patch by its contiguous run (legalize_amx.CHUNK_ATTR: the data's channel block)
        chunk = int(sch.get(q).annotations.get("kiln.amx_chunk", CHANNELS))
        if chunk in (4, 8, 16, 32, 64):
            vectorize_tails(sch, [q], chunk, split=True)
            _split_runs(sch, q, chunk)
    for c in consumers:  # the epilogue by the output's channel block (16, or 8 where 16 does not divide)
        inner = extent(sch, sch.get_loops(c)[-1])
        if c in at_root:
            parallel_vectorize(sch, c, inner if inner in (4, 8, 16) else CHANNELS)
        else:
            vectorize_tails(sch, [c], inner if inner in (4, 8, 16) else CHANNELS, split=True)
