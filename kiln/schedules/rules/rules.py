"""Default schedules (no tuning) on tvm.s_tir, for one fused kernel at a time. Each rule takes a
Schedule, the kernel's anchor block (its main reduction, or its output block for injective
kernels) and the machine's vector lanes, and parallelizes over cores, vectorizes the innermost
axis, and register-tiles reductions. A rule raises s_tir.ScheduleError when it does not apply."""

from __future__ import annotations

import math

import tvm
import tvm.sym
from tvm import s_tir

from .tiles import conv_register_tile, divisor_at_most, vector_width

DATA_PAR, COMM_REDUCE = 0, 2
MAX_STACK_FLOATS = 16384  # 64 KiB: a per-thread padded input tile on the stack
MIN_PARALLEL_TASKS = 8  # fewer outer iterations than this leave cores idle: parallelize the tile loop too
# a 1x1 conv whose width has no divisor in 4..8 (13: SqueezeNet's classifier, YOLO's 416-input grids) takes a
# row of up to 16 pixels as its tile on 32 registers: 1 pixel x 5 blocks re-read every weight per pixel
WIDE_ROW_REGISTERS, WIDE_ROW_PIXELS = 32, 16
TILE_ACCUMULATORS = 8  # register tile of a blocked conv whose width gives no tile: output blocks x pixels


def iter_types(sch: s_tir.Schedule, block) -> list[int]:
    return [int(iv.iter_type) for iv in sch.get(block).iter_vars]


def extent(sch: s_tir.Schedule, loop) -> int:
    return int(sch.get(loop).extent)


def blocks(sch: s_tir.Schedule) -> list:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def block_named(sch: s_tir.Schedule, name: str):
    """The kernel's one block of this name (ScheduleError when there is not exactly one)."""
    found = [b for b in blocks(sch) if sch.get(b).name_hint == name]
    if len(found) != 1:
        raise s_tir.ScheduleError(f"no single {name} block")
    return found[0]


def tile_consumers(sch: s_tir.Schedule, anchor) -> list:
    """The anchor's consumers that can be computed tile by tile: those writing exactly the anchor's
    output domain (as many elements, in any layout). A consumer that writes more (a Pad after a conv)
    stays at the root: computed at a tile it covers only the anchor's region (reverse_compute_at derives
    it from the producer), and the padding border is never written (seen as garbage in a ConvTranspose
    -> Pad kernel)."""

    def size(block):
        return math.prod(int(v) for v in sch.get(block).writes[0].source.shape)  # a layout transform keeps it

    return [c for c in sch.get_consumers(anchor) if size(c) == size(anchor)]


def tile_accumulator(sch: s_tir.Schedule, anchor, tile_loop, consumers: list, keep_misfits: bool = False):
    """The anchor's results accumulated in a local (register) tile written back at `tile_loop`, its
    epilogue blocks computed there too, tile by tile; returns the write-back block. With keep_misfits,
    an epilogue block that cannot move to the tile stays where it is (else the ScheduleError propagates)."""
    cache = sch.cache_write(anchor, 0, "local")
    sch.reverse_compute_at(cache, tile_loop, preserve_unit_loops=True)
    for c in consumers:
        try:
            sch.reverse_compute_at(c, tile_loop, preserve_unit_loops=True)
        except s_tir.ScheduleError:
            if not keep_misfits:
                raise
    return cache


def inline_all_but(sch: s_tir.Schedule, keep: list) -> None:
    """Inline every injective block except `keep` (producers into consumers, then epilogue chains
    into the last block), repeating until nothing more inlines."""
    keep_names = {sch.get(b).name_hint for b in keep}
    changed = True
    while changed:
        changed = False
        for b in blocks(sch):
            if sch.get(b).name_hint in keep_names or COMM_REDUCE in iter_types(sch, b):
                continue
            if not sch.get_consumers(b):  # an output block
                continue
            try:
                sch.compute_inline(b)
                changed = True
            except s_tir.ScheduleError:
                pass


def parallel_vectorize(sch: s_tir.Schedule, block, lanes: int, max_parallel_extent: int = 1 << 30) -> None:
    """Fuse all loops of an injective block, vectorize by the lanes that divide, parallelize the rest.
    Where the innermost extent is no multiple of the lanes (a 56- or 7-wide row), a vector of the fused
    loop would cross rows: each lane's 4-D index is its own div/mod of the fused index, which LLVM
    computes per lane and turns into gathers and scatters (a quantize ran at a fraction of the bandwidth; timings in
    benchmarks/history.md). Such a block vectorizes its innermost loop by the widest power of two up to the lanes
    that divides it (8 for 56), or runs it scalar, and parallelizes the loops outside."""
    loops = sch.get_loops(block)
    if not loops:  # a scalar (rank-0) block: nothing to parallelize or vectorize
        return
    last = extent(sch, loops[-1])
    if len(loops) > 2 and last < lanes and lanes % last == 0:  # a narrow channel block (NCHW4c): vectors span pixels
        loops = [*loops[:-2], sch.fuse(*loops[-2:])]
        last = extent(sch, loops[-1])
    if len(loops) > 1 and last % lanes and math.prod(extent(sch, lp) for lp in loops) >= lanes:
        v = vector_width(last, lanes)
        inner = []
        if v >= 4 and v & (v - 1) == 0:
            lo, li = sch.split(loops[-1], [None, v])
            sch.vectorize(li)
            loops, inner = loops[:-1] + [lo], [li]
        else:
            loops = loops[:-1]
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        if extent(sch, fused) > 1:
            sch.parallel(fused)
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    total = extent(sch, fused)
    vec = divisor_at_most(total, lanes) if total % lanes == 0 or total < lanes else 1
    if vec > 1:
        outer, inner = sch.split(fused, [None, vec])
        sch.vectorize(inner)
        if extent(sch, outer) > 1:
            sch.parallel(outer)
    elif total > 1:
        sch.parallel(fused)


LEFTOVER_MIN = 4096  # elements: smaller root blocks keep their serial loops (MobileNetV2 was 4-6% slower)


def vectorize_leftovers(sch: s_tir.Schedule, lanes: int) -> int:
    """Parallelize and vectorize every spatial block a rule left at the root with serial loops: epilogues
    that write more or fewer elements than the anchor's tile (an SE block's scale broadcast over the feature
    map after its 1x1 conv, a Pad after a conv, a slice of padded columns) stay outside the tile, and ran
    as one serial scalar loop (MobileNetV3's SE multiply; timings in benchmarks/history.md). Returns how many.
    Blocks are found on a copy: even looking them up adds to the schedule's trace, and a default schedule's
    trace is what tuned records are checked against (database.default_was_measured), so a kernel with no
    such block keeps its schedule and its records exactly."""
    try:
        look = sch.copy()
    except tvm.error.InternalError:  # TVM cannot copy a schedule with tensorized blocks (the int8 kernels)
        return 0
    todo = []
    for b in blocks(look):
        loops = look.get_loops(b)
        if not loops or COMM_REDUCE in iter_types(look, b):
            continue
        parent = look.get_sref(loops[0]).parent
        if parent is None or not isinstance(look.get(parent), s_tir.SBlock):
            continue  # not at the root: inside some tile
        if any(look.get(lp).kind != tvm.tirx.ForKind.SERIAL for lp in loops):
            continue
        if math.prod(extent(look, lp) for lp in loops) < LEFTOVER_MIN:
            continue  # a few vectors: a parallel loop's fork and join cost more than it
        trial = sch.copy()
        try:  # a failed parallel_vectorize may leave the loops half split
            parallel_vectorize(trial, trial.get_sblock(look.get(b).name_hint), lanes)
        except s_tir.ScheduleError:
            continue
        todo.append(look.get(b).name_hint)
    for name in todo:
        parallel_vectorize(sch, sch.get_sblock(name), lanes)
    return len(todo)


def vectorize_tails(sch: s_tir.Schedule, blocks_: list, width: int, split: bool = False) -> None:
    """Vectorize each block's innermost loop when its extent is `width` (with split=True, also a
    multiple of it, split by `width`): the write-back and epilogue blocks placed inside a tile."""
    for b in blocks_:
        inner = sch.get_loops(b)[-1]
        n = extent(sch, inner)
        if n == width:
            sch.vectorize(inner)
        elif split and n > width and n % width == 0:
            sch.vectorize(sch.split(inner, [None, width])[1])


def pad_producer(sch: s_tir.Schedule, anchor, names: tuple[str, ...] = ("pad",)):
    """The conv's padding block (TVM legalizes a padded conv as pad -> conv; topi's conv2d_NCHWc names it
    data_pad), the one producer whose name starts with one of `names`, or None."""
    pads = [p for p in sch.get_producers(anchor) if sch.get(p).name_hint.startswith(names)]
    return pads[0] if len(pads) == 1 else None


def injective(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    inline_all_but(sch, [])
    for b in blocks(sch):
        parallel_vectorize(sch, b, lanes)


STRIDED_LANES = 4  # outputs per accumulator row where the innermost input dimension is read with a stride


def strided_lanes(sch: s_tir.Schedule, block) -> bool:
    """Whether the block reads its innermost dimension with a stride over its last spatial iterator
    (vector lanes along it would each load separately: a gather)."""
    b = sch.get(block)
    spatial = [iv.var for iv in b.iter_vars if int(iv.iter_type) == DATA_PAR]
    for r in b.reads:
        coef = tvm.sym.detect_linear_equation(r.region[-1].min, [spatial[-1]]) if spatial and r.region else []
        if len(coef) == 2 and abs(int(coef[0])) > 1:
            return True
    return False


def _blocked_channels_first(sch: s_tir.Schedule, anchor, reduce: list, narrow: bool = False) -> list:
    """A blocked conv's reduction (input channel ic, then kh, kw) as (ic / c, kh, kw, ic % c), c the
    weights' input-channel block, so its weights [O/c', I/c, KH, KW, c, c'] are read in memory order.
    Read as (ic, kh, kw), every input channel touches KH x KW lines 1 KB apart: fine while the weights
    are cached, but in a model each weight is read once, from memory, and the prefetchers cannot follow
    (timings: benchmarks/history.md, "How far float32 can go"). 1x1 convs are split too on `narrow`
    (16-register) targets, where the caller unrolls ic % c (see conv_register_tile)."""
    b = sch.get(anchor)
    if not b.name_hint.startswith("conv2d_NCHWc") or len(reduce) != 3 or len(b.reads) < 2:
        return reduce
    weights = [int(v) for v in b.reads[1].source.shape]
    if len(weights) != 6 or extent(sch, reduce[0]) != weights[1] * weights[4]:
        return reduce
    if weights[2] * weights[3] == 1 and not narrow:
        return reduce
    ico, ici = sch.split(reduce[0], [None, weights[4]])
    return [ico, reduce[1], reduce[2], ici]


def _one_tap(sch: s_tir.Schedule, reduce: list) -> bool:
    """The conv's reduction is over input channels alone (a 1x1 kernel)."""
    return len(reduce) == 3 and extent(sch, reduce[1]) == 1 and extent(sch, reduce[2]) == 1


def _output_blocks_in_tile(sch: s_tir.Schedule, anchor, spatial: list, t: int) -> list:
    """A blocked conv whose output width has no divisor in 4..8 (13, 26: YOLO's 416-input grids) gets a
    register tile of t pixels, 1 at worst: one accumulator, a weight load per FMA, a small share of peak
    measured on such 3x3/s2 and 1x1 convs (timings in benchmarks/history.md). It takes several output-channel blocks
    into the tile instead (each input pixel broadcast once for all of them), up to 8 accumulators. Edits `spatial`
    in place; returns the new inner tile loop, or [] when the width's own tile is wide enough."""
    if t >= 4 or not sch.get(anchor).name_hint.startswith("conv2d_NCHWc") or len(spatial) != 4:
        return []
    b = divisor_at_most(extent(sch, spatial[1]), TILE_ACCUMULATORS // t)
    if b < 2:
        return []
    spatial[1], bi = sch.split(spatial[1], [None, b])
    return [bi]


def _padded_apart(narrow: tuple[int, int] | None) -> bool:
    """Whether a padded blocked conv pads its input in a stage of its own (one pass over the input) rather
    than inlined into its reduction (a bounds test per broadcast). Apart on 16-register targets whose
    tile spans several output-channel blocks, which then unroll the channels of a block (ResNet-50's
    3x3/2 convs for -mcpu=haswell ran faster). Not with a 1-block tile (its 7-wide stride-2 conv ran
    slower) nor on 32-register targets, whose row tile gained nothing from it (timings in benchmarks/history.md)."""
    return narrow is not None and narrow[1] > 1


def reduction_tiled(sch: s_tir.Schedule, anchor, lanes: int, registers: int = 32) -> None:
    """conv2d (any layout), matmul/dense, pooling: spatial loops outside, reductions inside a
    register tile of (tile x lanes) accumulators, the epilogue computed per tile. `registers`: the
    target's vector registers; blocked convs on 16-register targets take conv_register_tile."""
    if COMM_REDUCE not in iter_types(sch, anchor):  # TOPI's avg pool annotates its division, not its sum
        sums = [p for p in sch.get_producers(anchor) if COMM_REDUCE in iter_types(sch, p)]
        anchor = sums[0] if len(sums) == 1 else anchor
    pad = pad_producer(sch, anchor, ("data_pad",)) if sch.get(anchor).name_hint.startswith("conv2d_NCHWc") else None
    inline_all_but(sch, [anchor] + ([pad] if pad is not None else []))  # the pad: see _padded_apart
    strided = strided_lanes(sch, anchor)
    if strided:  # e.g. a stride-2 NCHW pool: lanes along W would each gather, so they run as unrolled scalars
        # (4 of them: the fastest on ResNet-50's 3x3/2 max pool, benchmarks/history.md)
        lanes = min(lanes, STRIDED_LANES)
    consumers = tile_consumers(sch, anchor)
    types = iter_types(sch, anchor)
    loops = sch.get_loops(anchor)
    if len(loops) != len(types):
        raise s_tir.ScheduleError("anchor loops and iterators do not match")
    spatial = [lp for lp, t in zip(loops, types) if t == DATA_PAR]
    reduce = [lp for lp, t in zip(loops, types) if t == COMM_REDUCE]
    if reduce and not spatial:
        return full_reduction(sch, anchor, reduce, lanes)
    if not spatial or not reduce:
        raise s_tir.ScheduleError("not a spatial + reduction block")
    vec_loop = spatial[-1]
    vec_ext = extent(sch, vec_loop)
    vec = vec_ext if vec_ext <= lanes and lanes % vec_ext == 0 and vec_ext > 1 else vector_width(vec_ext, lanes)
    if vec > 1 and vec != vec_ext:
        vo, vec_loop = sch.split(vec_loop, [None, vec])
        spatial = spatial[:-1] + [vo]
    else:
        spatial = spatial[:-1]
    spatial, tile_inner, narrow = _register_tile(sch, anchor, spatial, reduce, registers)
    if pad is not None and not _padded_apart(narrow):
        sch.compute_inline(pad)
        pad = None
    split = _blocked_channels_first(sch, anchor, reduce, narrow=narrow is not None)
    # a 1x1 conv's input channels within a block unrolled: constant offsets instead of per-channel (ic / c, ic % c)
    # index arithmetic (Zen 3: 48 instructions for 14 FMAs). Not with kh x kw taps read through an inlined
    # padding, which it slowed (benchmarks/history.md); with the padding apart it is a gain (_padded_apart)
    unroll_channels = narrow is not None and len(split) == 4 and (_one_tap(sch, reduce) or pad is not None)
    reduce = split
    order = spatial + reduce + tile_inner + ([vec_loop] if vec > 1 else [])
    sch.reorder(*order)
    if spatial:
        cache = tile_accumulator(sch, anchor, spatial[-1], consumers, keep_misfits=True)
    else:
        cache = sch.cache_write(anchor, 0, "local")
    if vec > 1:
        if strided:
            sch.unroll(vec_loop)
        else:
            sch.vectorize(vec_loop)
        vectorize_tails(sch, [cache, *consumers], vec, split=True)
    for ti in tile_inner:
        sch.unroll(ti)
    if unroll_channels:
        sch.unroll(reduce[-1])
    outer = spatial[:-1] if len(spatial) > 1 else spatial
    if outer and math.prod(extent(sch, lp) for lp in outer) < MIN_PARALLEL_TASKS:
        outer = spatial  # e.g. a classifier's [1, 1000]: parallel over its tiles, not its one row
    if outer:
        par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        sch.parallel(par)
    sch.decompose_reduction(anchor, reduce[0])
    if pad is not None:
        parallel_vectorize(sch, pad, lanes)


def _register_tile(sch: s_tir.Schedule, anchor, spatial: list, reduce: list, registers: int):
    """reduction_tiled's register tile, split off the spatial loops (the vector loop already taken out):
    t pixels of the innermost spatial loop, and for a blocked conv output-channel blocks too (conv_register_tile
    on 16-register targets, _output_blocks_in_tile for narrow widths). Returns (spatial loops outside the
    tile, the tile's loops, conv_register_tile's (pixels, blocks) or None)."""
    tile_inner = []
    blocked = sch.get(anchor).name_hint.startswith("conv2d_NCHWc") and len(spatial) == 4
    narrow = conv_register_tile(extent(sch, spatial[-1]), extent(sch, spatial[1]), registers) if blocked else None
    if spatial:
        t = narrow[0] if narrow else divisor_at_most(extent(sch, spatial[-1]), 8)
        if blocked and not narrow and t < 4 and registers >= WIDE_ROW_REGISTERS and _one_tap(sch, reduce):
            t = max(t, divisor_at_most(extent(sch, spatial[-1]), WIDE_ROW_PIXELS))
        if t > 1:
            to, ti = sch.split(spatial[-1], [None, t])
            spatial, tile_inner = spatial[:-1] + [to], [ti]
        if narrow and narrow[1] > 1:
            spatial[1], bi = sch.split(spatial[1], [None, narrow[1]])
            tile_inner = [bi] + tile_inner
        elif not narrow:
            tile_inner = _output_blocks_in_tile(sch, anchor, spatial, t) + tile_inner
    return spatial, tile_inner, narrow


def full_reduction(sch: s_tir.Schedule, anchor, reduce: list, lanes: int) -> None:
    """A reduction to one value (a dynamic quantizer's min and max over a tensor, a global sum): the
    reduction loops fused and split into vector-wide partial results (rfactor), which run as one vector
    op per step, then one reduction of those. Left unscheduled, gpt2_qdynamic's 16 such kernels took
    a third of its run, one scalar max or min per element (timings in benchmarks/history.md)."""
    for b in blocks(sch):  # a consumer of a 0-D result has no loop; TVM's rfactor then fails ("block_realize")
        if not sch.get_loops(b):
            sch.add_unit_loop(b)
    fused = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
    v = vector_width(extent(sch, fused), lanes)
    if v < 4:
        raise s_tir.ScheduleError("too few elements, or no vector width divides them")
    outer, inner = sch.split(fused, [None, v])
    partial = sch.rfactor(inner, 0)  # a ScheduleError for reducers TVM does not know (infinite identities)
    sch.vectorize(sch.get_loops(partial)[-1])
    sch.decompose_reduction(partial, sch.get_loops(partial)[0])


def rowwise(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """Kernels with several reductions (softmax, layer norm): inline what inlines, then run each
    remaining block's outer data-parallel loops in parallel and vectorize innermost spatial loops."""
    inline_all_but(sch, [b for b in blocks(sch) if COMM_REDUCE in iter_types(sch, b)])
    for b in blocks(sch):
        types = iter_types(sch, b)
        loops = sch.get_loops(b)
        if len(loops) != len(types):
            continue
        lead = []
        for lp, t in zip(loops, types):
            if t != DATA_PAR:
                break
            lead.append(lp)
        if len(lead) == len(loops) and len(lead) > 1 and extent(sch, lead[-1]) % lanes == 0:
            _, inner = sch.split(lead[-1], [None, lanes])
            sch.vectorize(inner)
            lead = lead[:-1] + [sch.get_loops(b)[len(lead) - 1]]
        outer = [lp for lp in lead[:-1] or lead if extent(sch, lp) > 1][:2]
        if outer:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


def conv_nchw_oc_vectorized(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """NCHW conv2d (e.g. a 3-channel stride-2 stem that cannot be channel-blocked): vectorize over
    output channels, not width (a strided width gives gathers). The weights are re-laid out as
    [O/lanes, I, KH, KW, lanes] in a cache stage so each vector load is contiguous; each input
    pixel is broadcast into `tile` vector FMAs. The accumulator tile is [pixel, channel] (so its
    vectors are contiguous), the epilogue is vectorized along the width, and the input rows one
    output row reads are padded once into a stack buffer (no condition in the FMA loop). Timings
    on MobileNetV2's stem: benchmarks/history.md."""
    types = iter_types(sch, anchor)
    loops = sch.get_loops(anchor)
    if types != [DATA_PAR] * 4 + [COMM_REDUCE] * 3 or extent(sch, loops[1]) % lanes != 0:
        raise s_tir.ScheduleError("not an NCHW conv with output channels divisible by the lanes")
    pad = pad_producer(sch, anchor)
    if pad is not None:  # [C_in, KH, W_padded] floats per output row must fit the stack comfortably
        shape = [int(d) for d in sch.get(pad).writes[0].source.shape]
        if shape[1] * extent(sch, loops[5]) * shape[3] > MAX_STACK_FLOATS:
            pad = None
    inline_all_but(sch, [anchor] + ([pad] if pad is not None else []))
    consumers = tile_consumers(sch, anchor)
    wcache = sch.cache_read(anchor, 1, "global")
    sch.transform_layout(wcache, ("write", 0), lambda o, i, h, w: (o // lanes, i, h, w, o % lanes))
    n, oc, oh, ow, ic, kh, kw = sch.get_loops(anchor)
    oc_o, oc_i = sch.split(oc, [None, lanes])
    t = divisor_at_most(extent(sch, ow), 8)
    ow_o, ow_i = sch.split(ow, [None, t])
    sch.reorder(n, oh, oc_o, ow_o, ic, kh, kw, ow_i, oc_i)
    cache = sch.cache_write(anchor, 0, "local")
    sch.transform_layout(anchor, ("write", 0), lambda a, c, y, x: (a, y, x, c))  # the local tile: channels innermost
    sch.reverse_compute_at(cache, ow_o, preserve_unit_loops=True)
    for c in consumers:
        sch.reverse_compute_at(c, ow_o, preserve_unit_loops=True)
    sch.vectorize(oc_i)
    sch.unroll(ow_i)
    parallel_rows(sch, n, oh, oc_o, pad)
    sch.decompose_reduction(anchor, ic)
    sch.parallel(sch.get_loops(wcache)[0])
    if t >= 4:
        vectorize_tails(sch, [cache, *consumers], t)


def parallel_rows(sch: s_tir.Schedule, n, oh, oc_o, pad) -> None:
    """Parallel over a conv's output rows, and over its output-channel blocks too when the rows are too few
    (a height-1 conv: a conv1d, Conv1dAsConv2d); the padded input rows a task reads (`pad`, or None) are
    written at that loop into a stack buffer."""
    rows = extent(sch, n) * extent(sch, oh)
    par = sch.fuse(n, oh, oc_o) if rows < MIN_PARALLEL_TASKS else sch.fuse(n, oh)
    sch.parallel(par)
    if pad is not None:
        sch.compute_at(pad, par, preserve_unit_loops=True)
        sch.set_scope(pad, 0, "local")


def layout_transform_tiled(sch: s_tir.Schedule, anchor, lanes: int) -> None:
    """NCHW <-> NCHW{lanes}c transforms (where blocked and unblocked convs meet): a transpose of
    [lanes channels x t pixels] tiles. Each tile is read with contiguous vector loads into a local
    buffer and written out with contiguous vector stores along the other axis (a plain fused loop
    vectorizes only one side and scatters or gathers the other). Timings: benchmarks/history.md."""
    bs = blocks(sch)
    if len(bs) != 1 or not sch.get(bs[0]).name_hint.startswith("te_layout_transform"):
        raise s_tir.ScheduleError("not a single layout-transform block")
    blk = bs[0]
    loops = sch.get_loops(blk)
    shapes = [[int(d) for d in r.source.shape] for r in (sch.get(blk).reads[0], sch.get(blk).writes[0])]
    blocking = (
        len(loops) == 4 and len(shapes[1]) == 5 and shapes[1][-1] == lanes and shapes[1][1] * lanes == shapes[0][1]
    )
    unblocking = (
        len(loops) == 5 and len(shapes[0]) == 5 and shapes[0][-1] == lanes and shapes[1][1] == shapes[0][1] * lanes
    )
    if not (blocking or unblocking):
        raise s_tir.ScheduleError("not an NCHW <-> NCHW{lanes}c transform")
    t = vector_width(extent(sch, loops[3]), lanes)
    if t < (4 if blocking else 8):  # measured: narrower tiles lose to the plain fused loop
        raise s_tir.ScheduleError("width too narrow for a transposed tile")
    if blocking:
        n, c, h, w = loops
        cb, ci = sch.split(c, [None, lanes])
        wo, wi = sch.split(w, [None, t])
        sch.reorder(n, cb, h, wo, ci, wi)
        inner, outer = wi, ci  # the tile is loaded along w, stored along c
    else:
        n, cb, h, w, ci = loops
        wo, wi = sch.split(w, [None, t])
        sch.reorder(n, cb, h, wo, wi, ci)
        inner, outer = ci, wi
    cache = sch.cache_read(blk, 0, "local")
    sch.compute_at(cache, wo, preserve_unit_loops=True)
    cl = sch.get_loops(cache)
    sch.vectorize(cl[-1])
    sch.unroll(cl[-2])
    sch.reorder(inner, outer)
    sch.vectorize(outer)
    sch.unroll(inner)
    sch.parallel(sch.fuse(n, cb, h))
