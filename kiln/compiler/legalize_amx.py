"""Legalization of a blocked uint8 x int8 conv2d for AMX targets (schedules/rules/amx.py): one output row
at a time (a small map: all of it, row_tasks) is a GEMM [pixels, K] x [K, O] on the tile unit.

  amx_pad    the zero-padded input (as legalize_int8 pads it), when the conv pads
  amx_patch  [N, OH, W', K'] (a small map: [N, 1, W', K']): each output pixel's receptive field as one
             row of K = KH*KW*C bytes, ordered (ry, rx, channel); rows padded to W' (pixel_rows) and K to K'
             (a multiple of 64) by re-reading valid elements, never branching: padded columns meet zero
             weights and padded rows are sliced away
  amx_pack   the weights as AMX's B operand [O/16, K'/4, 16, 4], zero beyond K (constant-folded)
  acc        int32 [N, O/16, OH, W', 16], the GEMM the schedule tensorizes per row
  the conv's output [N, O/16, OH, OW, 16]: acc without the padded rows

The int8 paths' requantization epilogues fuse after it as after any int8 conv. A matmul of 16 rows or
more (matmul_amx) is the same computation with rows of the matmul for pixels."""

from __future__ import annotations

import tvm
from tvm import relax, te, topi

from ..schedules.rules.amx import CHANNELS, K_STEP, ROWS, RUNS_ATTR, TILE_ROWS_ATTR, pixel_rows
from ..schedules.rules.int8 import ANNOTATION

KIND = "conv2d_amx"
CHUNK_ATTR = "kiln.amx_chunk"  # the patch's contiguous run (the data's channel block): the rule vectorizes by it
MAP_PIXELS = 64  # a map narrower than a tile and of at most this many pixels is one task's rows (row_tasks)


def pack_amx_weights(kernel, k_padded: int):
    """[O/b, I/c, KH, KW, c(i), b(o)] -> [O'/16, K'/4, 16, 4] with input (ry, rx, ci) = kk and output
    channel o * 16 + j, zero past K and past O (O' = O rounded up to 16)."""
    ob, ib, kh, kw, c, b = (int(v) for v in kernel.shape)
    k, o_total = ib * kh * kw * c, ob * b

    def at(o, k4, j, t):
        kk, oc = k4 * 4 + t, o * CHANNELS + j
        ci, rest = kk % (ib * c), kk // (ib * c)
        rx, ry = rest % kw, tvm.te.min(rest // kw, kh - 1)
        oc_in = tvm.te.min(oc, o_total - 1)
        w = kernel[oc_in // b, ci // c, ry, rx, ci % c, oc_in % b]
        return tvm.tirx.Select(tvm.tirx.all(kk < k, oc < o_total), w, tvm.tirx.const(0, kernel.dtype))

    return te.compute((-(-o_total // CHANNELS), k_padded // 4, CHANNELS, 4), at, name="amx_pack")


def row_tasks(oh: int, ow: int) -> tuple[int, int, int]:
    """(output rows per task, the task's padded pixel count, pixels per tile): one row a task (pixel_rows), except
    a map narrower than a tile with at most MAP_PIXELS: the whole map in one task's rows, in an even number of tiles
    (the last padded), so the 2 x 2 blocking reads each weight tile once for two pixel tiles. One 7-pixel row a
    task used 7 of a tile's 16 rows and read all of the task's weights from L2 for them: ResNet-50's 7x7 stage
    ran 15-35% slower (benchmarks/history.md). Two 14-pixel rows a task (2 tiles) instead of one did not speed up
    its 14x14 stage."""
    if ow >= ROWS or oh * ow > MAP_PIXELS:
        return (1, *pixel_rows(ow))
    pixels = oh * ow
    if pixels <= ROWS:
        return oh, pixels, pixels
    tiles = -(-pixels // ROWS)
    tiles += tiles % 2
    rows = -(-pixels // tiles)
    return oh, tiles * rows, rows


def conv2d_amx(data, packed, strides, padding, dilation, kernel_hw, out_channels: int, out_block: int = CHANNELS):
    """uint8 data [N, C/c, H, W, c] x packed weights -> int32 [N, O/b, OH, OW, b], b = out_block."""
    n, cb, h, w, c = (int(v) for v in data.shape)
    kh, kw = kernel_hw
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    rpt, width, rows = row_tasks(oh, ow)
    k = kh * kw * cb * c
    k_padded = int(packed.shape[1]) * 4
    if any(padding):
        zero = tvm.tirx.const(0, data.dtype)
        data = topi.nn.pad(data, [0, 0, pt, pl, 0], [0, 0, pb, pr, 0], pad_value=zero, name="amx_pad")

    def patch_at(b, s, p, kk):
        if k_padded > k:  # clamped by chunks of c (one pixel's channel block), so that a chunk stays one vector
            kk = tvm.te.min(kk // c, k // c - 1) * c + kk % c
        ci, rest = kk % (cb * c), kk // (cb * c)
        rx, ry = rest % kw, rest // kw
        if rpt == 1:
            y, x = s, tvm.te.min(p, ow - 1)
        else:  # the whole map, flattened
            q = tvm.te.min(p, oh * ow - 1)
            y, x = q // ow, q % ow
        return data[b, ci // c, y * sh + ry * dh, x * sw + rx * dw, ci % c]

    runs = {RUNS_ATTR: [kh * kw, cb]} if k_padded == k else {}
    patch = te.compute((n, oh // rpt, width, k_padded), patch_at, name="amx_patch", attrs={CHUNK_ATTR: c, **runs})
    k4, t = te.reduce_axis((0, k_padded // 4), name="k4"), te.reduce_axis((0, 4), name="t")
    acc = te.compute(
        (n, int(packed.shape[0]), oh // rpt, width, CHANNELS),
        lambda b, o, y, p, j: te.sum(
            patch[b, y, p, k4 * 4 + t].astype("int32") * packed[o, k4, j, t].astype("int32"), axis=[k4, t]
        ),
        name="conv2d_amx",
        attrs={ANNOTATION: "amx-int8", "kiln.kernel_kind": KIND, **({TILE_ROWS_ATTR: rows} if rpt > 1 else {})},
    )
    ob = out_block

    def out_at(i, o, y, x, j):
        s, p = (y, x) if rpt == 1 else (0, y * ow + x)
        return acc[i, (o * ob + j) // CHANNELS, s, p, (o * ob + j) % CHANNELS]

    return te.compute((n, out_channels // ob, oh, ow, ob), out_at, name="amx_rows")


def fits(call) -> bool:
    """A groups-1 NCHW{c}c conv with OIHW{c}i{b}o weights, b dividing 16: the int8 layout for 16 int32 lanes,
    or the 8-channel blocks of convs whose channels 16 does not divide (MobileNetV2's 24, 40, ...)."""
    w = call.args[1].ty
    return int(call.attrs.groups) == 1 and len(w.shape) == 6 and CHANNELS % int(w.shape[5]) == 0


def conv2d(bb, call):
    """The AMX computes of a blocked uint8 x int8 conv2d (legalize_int8.conv2d checked dtypes and layouts)."""
    a, w = call.attrs, call.args[1].ty
    ob, ib, kh, kw, c, co = (int(v) for v in w.shape)
    k = ib * kh * kw * c
    k_padded = -(-k // K_STEP) * K_STEP
    packed = bb.emit_te(pack_amx_weights, call.args[1], k_padded, primfunc_name_hint="amx_pack")
    return bb.call_te(
        conv2d_amx,
        call.args[0],
        packed,
        [int(v) for v in a.strides],
        [int(v) for v in a.padding],
        [int(v) for v in a.dilation],
        (kh, kw),
        ob * co,
        co,
        primfunc_name_hint="conv2d_amx",
    )


MIN_ROWS = 16  # fewer rows than a tile: the weights' loads dominate, and VNNI's matmul reads them as fast
ROW_GROUP = 32  # rows per task when there are more than a tile (2 pixel tiles: the 2 x 2 blocking)


def pack_amx_dense(w, k_padded: int):
    """[K, N] -> [N/16, K'/4, 16, 4], zero past K."""
    k, n = (int(v) for v in w.shape)

    def at(o, k4, j, t):
        kk = k4 * 4 + t
        return tvm.tirx.Select(kk < k, w[tvm.te.min(kk, k - 1), o * CHANNELS + j], tvm.tirx.const(0, w.dtype))

    return te.compute((n // CHANNELS, k_padded // 4, CHANNELS, 4), at, name="amx_pack")


def matmul_amx(x, packed, group: int):
    """uint8 [..., K] x packed weights -> int32 [..., N], as conv2d_amx with rows of the matmul for
    pixels: [1, M'/group, group, K'] rows (clamped reads past M and K) x B -> [1, N/16, M'/group, group, 16]."""
    *lead, k = (int(v) for v in x.shape)
    m = 1
    for d in lead:
        m *= d
    groups = -(-m // group)
    k_padded = int(packed.shape[1]) * 4
    n = int(packed.shape[0]) * CHANNELS

    def row_at(r):  # flat row r -> the leading indices of x (unit dimensions: 0, no index arithmetic)
        idx = []
        for d in reversed(lead):
            idx.append(r % d if d > 1 else 0)
            r = r // d if d > 1 else r
        return idx[::-1]

    def patch_at(b, g, p, kk):
        r = tvm.te.min(g * group + p, m - 1)
        if k_padded > k:
            kk = tvm.te.min(kk // 16, k // 16 - 1) * 16 + kk % 16 if k % 16 == 0 else tvm.te.min(kk, k - 1)
        return x[(*row_at(r), kk)]

    patch = te.compute((1, groups, group, k_padded), patch_at, name="amx_patch")
    k4, t = te.reduce_axis((0, k_padded // 4), name="k4"), te.reduce_axis((0, 4), name="t")
    acc = te.compute(
        (1, n // CHANNELS, groups, group, CHANNELS),
        lambda b, o, g, p, j: te.sum(
            patch[b, g, p, k4 * 4 + t].astype("int32") * packed[o, k4, j, t].astype("int32"), axis=[k4, t]
        ),
        name="matmul_amx",
        attrs={ANNOTATION: "amx-int8", "kiln.kernel_kind": KIND},
    )

    def out_at(*i):
        r = 0
        for d, v in zip(lead, i[:-1]):
            r = r * d + v if d > 1 else r
        return acc[0, i[-1] // CHANNELS, r // group, r % group, i[-1] % CHANNELS]

    return te.compute((*lead, n), out_at, name="amx_rows")


def matmul_fits(call) -> bool:
    """A static uint8 [..., K] x int8 [K, N] matmul with N a multiple of 16 and at least a tile of rows."""
    x, w = list(call.args[0].ty.shape.values), call.args[1].ty
    if len(w.shape) != 2 or int(w.shape[1]) % CHANNELS or not all(isinstance(d, tvm.tirx.IntImm) for d in x):
        return False
    return _rows(x) >= MIN_ROWS


def _rows(dims) -> int:
    rows = 1
    for d in dims[:-1]:
        rows *= int(d)
    return rows


def matmul(bb, call):
    """The AMX computes of a uint8 x int8 matmul (legalize_int8.matmul checked the dtypes)."""
    w = call.args[1].ty
    k = int(w.shape[0])
    packed = bb.emit_te(pack_amx_dense, call.args[1], -(-k // K_STEP) * K_STEP, primfunc_name_hint="amx_pack")
    dims = [int(d) for d in call.args[0].ty.shape.values]
    rows = _rows(dims)
    group = ROW_GROUP if rows >= 2 * ROW_GROUP else 16 if rows > 16 else rows
    if sum(d > 1 for d in dims[:-1]) <= 1:  # one row index: the epilogue fuses and moves to each task's rows
        return bb.call_te(matmul_amx, call.args[0], packed, group, primfunc_name_hint="matmul_amx")
    # several (a batch of sequences): rows flattened by reshapes, which the epilogue cannot follow into the tiles
    x = bb.emit(relax.op.reshape(call.args[0], [rows, k]))
    out = bb.emit(bb.call_te(matmul_amx, x, packed, group, primfunc_name_hint="matmul_amx"))
    return relax.op.reshape(out, [*dims[:-1], int(w.shape[1])])
