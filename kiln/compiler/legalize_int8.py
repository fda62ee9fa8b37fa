"""Legalization of uint8 x int8 -> int32 conv2d (blocked NCHW{L}c) and matmul into Kiln's int8
computes, shaped for the target's int8 kernel (schedules/rules/int8.py, from Target.caps): weights packed
into (L output channels x 4 inputs) tiles by a constant-folded kernel, L the kernel's int32 lanes
(16 zmm, 8 ymm, 4 NEON). Each compute names its kernel in a block annotation for the schedule rule.

sdot kernels (arm dotprod) multiply signed bytes only: the data is shifted to int8 (x - 128, the
padding shifted with it) and 128 * sum(w) per output channel is added back, which is exact:
sum((x - 128) * w) + 128 * sum(w) = sum(x * w)."""

from __future__ import annotations

import tvm
from tvm import te, topi

from ..capabilities import Int8Path
from ..schedules.rules.int8 import ANNOTATION, STEP, Int8Kernel, kernel_for_channels, kernel_for_lanes, rounded_rows
from . import legalize_amx


def pack_int8_kernel(kernel):
    """[O/L, I/c, KH, KW, c(i), L(o)] -> [O/L, I/c, KH, KW, c/4, L(o), 4(i)]: each L x 4 tile is
    one dot-product operand (4 input channels of L output channels, contiguous)."""
    ob, ib, kh, kw, ci, co = kernel.shape
    return te.compute(
        (ob, ib, kh, kw, ci // STEP, co, STEP),
        lambda o, i, h, w, a, oc, b: kernel[o, i, h, w, a * STEP + b, oc],
        name="int8_kernel_pack",
    )


def pack_int8_dense(w, lanes: int):
    """[K, N] -> [N/L, K/4, L, 4]: each L x 4 tile one dot-product operand."""
    k, n = w.shape
    return te.compute(
        (n // lanes, k // STEP, lanes, STEP),
        lambda nb, ko, j, i: w[ko * STEP + i, nb * lanes + j],
        name="int8_dense_pack",
    )


def int8_weight_sums(packed):
    """128 * the sum of each output channel's packed weights: [blocks, L] (the sdot compensation).
    The channel is (axis 0, axis -2) in both packed layouts; every other axis is summed."""
    shape = list(packed.shape)
    lane_axis = len(shape) - 2
    rs = {i: te.reduce_axis((0, shape[i]), name=f"r{i}") for i in range(1, len(shape)) if i != lane_axis}

    def body(ob, lane):
        idx = [ob, *(lane if i == lane_axis else rs[i] for i in range(1, len(shape)))]
        return te.sum(packed[tuple(idx)].astype("int32") * 128, axis=list(rs.values()))

    return te.compute((shape[0], shape[lane_axis]), body, name="int8_weight_sums")


def _shift(data):
    """uint8 -> int8 codes x - 128 (the sdot kernels' operand)."""
    return te.compute(data.shape, lambda *i: (data(*i).astype("int32") - 128).astype("int8"), name="int8_shift")


def conv2d_nchwc_int8(data, packed, sums, strides, padding, dilation, kernel: str):
    """uint8 data [N, C/c, H, W, c] x int8 packed weights -> int32 [N, O/L, OH, OW, L]; the
    innermost (L outputs x 4 inputs) is what the int8 schedule tensorizes. `sums` (sdot kernels
    only, else None): the compensation added to the accumulator."""
    n, cb, h, w, c = data.shape
    ob, _, kh, kw, c4, oc, _ = packed.shape
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    if any(padding):
        data = topi.nn.pad(
            data, [0, 0, pt, pl, 0], [0, 0, pb, pr, 0], pad_value=tvm.tirx.const(0, data.dtype), name="int8_pad"
        )
    if sums is not None:
        data = _shift(data)
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    ic = te.reduce_axis((0, cb), name="ic")
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    i4o, i4i = te.reduce_axis((0, c4), name="i4o"), te.reduce_axis((0, STEP), name="i4i")
    acc = te.compute(
        (n, ob, oh, ow, oc),
        lambda b, o, y, x, k: te.sum(
            data[b, ic, y * sh + ry * dh, x * sw + rx * dw, i4o * STEP + i4i].astype("int32")
            * packed[o, ic, ry, rx, i4o, k, i4i].astype("int32"),
            axis=[ic, ry, rx, i4o, i4i],
        ),
        name="conv2d_NCHWc_int8",
        attrs={ANNOTATION: kernel, "kiln.kernel_kind": "conv2d_int8"},
    )
    if sums is None:
        return acc
    return te.compute(acc.shape, lambda b, o, y, x, k: acc[b, o, y, x, k] + sums[o, k], name="int8_compensate")


def matmul_int8(x, packed, sums, kernel: str, rows: int | None = None):
    """uint8 [..., K] x packed int8 weights -> int32 [..., N] (`sums` as in conv2d_nchwc_int8). rows: compute over
    the rows (axis -2) rounded up to that many, the padding rows reading the last real row, then crop (a row
    count with no good register tile: int8.rounded_rows)."""
    nb, k4, lanes, _ = packed.shape
    if sums is not None:
        x = _shift(x)
    m = int(x.shape[-2]) if rows is not None else None
    shape = (*x.shape[:-2], rows, x.shape[-1]) if rows is not None else x.shape

    def row(i):
        return (*i[:-2], te.min(i[-2], m - 1)) if rows is not None else i[:-1]

    ko, ki = te.reduce_axis((0, k4), name="ko"), te.reduce_axis((0, STEP), name="ki")
    acc = te.compute(
        (*shape[:-1], nb * lanes),
        lambda *i: te.sum(
            x[(*row(i), ko * STEP + ki)].astype("int32")
            * packed[i[-1] // lanes, ko, i[-1] % lanes, ki].astype("int32"),
            axis=[ko, ki],
        ),
        name="matmul_int8",
        attrs={ANNOTATION: kernel, "kiln.kernel_kind": "matmul_int8"},
    )
    if sums is not None:
        acc = te.compute(acc.shape, lambda *i: acc(*i) + sums[i[-1] // lanes, i[-1] % lanes], name="int8_compensate")
    if rows is None:
        return acc
    return te.compute((*x.shape[:-1], nb * lanes), lambda *i: acc(*i), name="matmul_int8_rows")


def _u8s8(call) -> bool:
    x, w = call.args[0].ty, call.args[1].ty
    return str(x.dtype) == "uint8" and str(w.dtype) == "int8" and str(call.ty.dtype) == "int32"


def conv2d(bb, call, kernel: Int8Kernel | None):
    """The int8 compute of a blocked uint8 x int8 conv2d the kernel fits (groups 1, NCHW{c}c data
    with c a multiple of 4, OIHW{c}i{L}o weights with L the lanes of the kernel or of its narrow
    sibling, schedules/int8.NARROW), or None (legalized as any other conv)."""
    a = call.attrs
    x, w = call.args[0].ty, call.args[1].ty
    blocked = (
        kernel is not None
        and _u8s8(call)
        and int(a.groups) == 1
        and len(x.shape) == 5
        and len(w.shape) == 6
        and str(a.kernel_layout).startswith("OIHW")
        and str(a.out_layout).startswith("NCHW")
    )
    if blocked and kernel.path == Int8Path.AMX_INT8 and legalize_amx.fits(call):  # any channel blocks, in and out
        return legalize_amx.conv2d(bb, call)
    if not blocked or int(x.shape[4]) % STEP:
        return None
    kernel = kernel_for_lanes(kernel, int(w.shape[5]))  # 8-channel blocks on AVX-512 take the ymm sibling
    if kernel is None:
        return None
    packed = bb.emit_te(pack_int8_kernel, call.args[1], primfunc_name_hint="int8_kernel_pack")
    sums = bb.emit_te(int8_weight_sums, packed, primfunc_name_hint="int8_weight_sums") if kernel.signed_data else None
    return bb.call_te(
        conv2d_nchwc_int8,
        call.args[0],
        packed,
        sums,
        [int(v) for v in a.strides],
        [int(v) for v in a.padding],
        [int(v) for v in a.dilation],
        kernel.path,
        primfunc_name_hint="conv2d_NCHWc_int8",
    )


def matmul(bb, call, kernel: Int8Kernel | None):
    """The int8 compute of a uint8 [..., K] x int8 [K, N] matmul (K % 4 == 0, N a multiple of the lanes of the
    kernel or of its narrow sibling: a 1000-class head runs 8 lanes on AVX-512), or None."""
    w = call.args[1].ty
    if kernel is None or not _u8s8(call) or len(w.shape) != 2 or int(w.shape[0]) % STEP:
        return None
    if kernel.path == Int8Path.AMX_INT8 and legalize_amx.matmul_fits(call):
        return legalize_amx.matmul(bb, call)
    kernel = kernel_for_channels(kernel, int(w.shape[1]))
    if kernel is None:
        return None
    packed = bb.emit_te(pack_int8_dense, call.args[1], kernel.lanes, primfunc_name_hint="int8_dense_pack")
    sums = bb.emit_te(int8_weight_sums, packed, primfunc_name_hint="int8_weight_sums") if kernel.signed_data else None
    dims = call.args[0].ty.shape.values if call.args[0].ty.shape is not None else []
    static = len(dims) >= 2 and all(isinstance(d, tvm.tirx.IntImm) for d in dims)
    rows = rounded_rows(int(dims[-2]), int(w.shape[1]) // kernel.lanes, kernel.accumulators) if static else None
    return bb.call_te(matmul_int8, call.args[0], packed, sums, kernel.path, rows, primfunc_name_hint="matmul_int8")
