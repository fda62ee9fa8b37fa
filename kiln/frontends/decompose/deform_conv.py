"""DeformConv (opset 19; DCN detectors, torchvision.ops.deform_conv2d) in ops TVM converts: each kernel tap's
input, bilinearly sampled at the tap's position plus its learned offset (zero outside the image), is one
GridSample over every offset group; the taps times their modulation mask are the columns of an im2col, and the
grouped convolution is one batched MatMul with the weight (onnx/reference/ops/op_deform_conv.py's semantics)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ...errors import UnsupportedModelError
from .emitter import Emitter
from .standard_math import FLOATS, attrs_of, dtype_of, np_of


def deform_conv(node, em: Emitter, shapes, consts, where):
    xs, ws, offs = (tuple(np.shape(consts[i])) if i in consts else shapes.get(i) for i in node.input[:3])
    if not (xs and ws and offs) or len(xs) != 4 or any(not isinstance(d, int) or d <= 0 for d in [*xs, *ws, *offs]):
        raise UnsupportedModelError(
            f"DeformConv {node.name!r}: only 2-D DeformConv with static shapes is supported "
            f"(input {xs}, weight {ws}, offset {offs})",
            where=where,
            fix="pin every input's shape with --input-shape NAME:DIMS",
        )
    a = attrs_of(node)
    (n, c, h, w), (m, _, kh, kw), (_, _, ho, wo) = xs, ws, offs
    g, og = a.get("group", 1), a.get("offset_group", 1)
    sh, sw = a.get("strides", [1, 1])
    dh, dw = a.get("dilations", [1, 1])
    ph, pw = a.get("pads", [0, 0, 0, 0])[:2]
    k = kh * kw
    ty = dtype_of(node.input[0], consts)
    ft = np_of(ty) if ty in FLOATS else np.float32
    i, j = np.divmod(np.arange(k), kw)
    base_y = (np.arange(ho)[None, :, None] * sh - ph + i[:, None, None] * dh) * np.ones((1, 1, wo))
    base_x = (np.arange(wo)[None, None, :] * sw - pw + j[:, None, None] * dw) * np.ones((1, ho, 1))
    geometry = (n, c, h, w, m, k, ho, wo, g, og)
    if g == 1 and ft == np.float32 and n * og * h * w < 1 << 24:  # row numbers exact in float32
        y = _gathered_rows(node, em, geometry, base_y, base_x, ft)
    else:
        y = _grid_sample_columns(node, em, geometry, base_y, base_x, ft)
    if len(node.input) > 3 and node.input[3]:
        y = em.op("Add", [y, em.reshape(node.input[3], [1, m, 1, 1])])
    em.op("Identity", [y], out=node.output[0])
    return True


def _gathered_rows(node, em: Emitter, geometry, base_y, base_x, ft) -> str:
    """groups = 1: each output pixel's row of the im2col, (offset group, tap, channel) innermost, by gathering the
    four neighbours' channel vectors of the input transposed to pixels x channels (one row per pixel), weighted
    by the bilinear factors (zero for a neighbour outside the image, times the modulation mask); then rows x the
    weight reordered to match, so a constant weight is the matmul's right operand and packed at compile time.
    GridSample's channel-major taps made the matmul's operand a transposed copy: ResNet-18-DCN's layer-3 taps and
    their transpose 0.25 ms a call in TVM's kernels, its weight-on-the-left matmul 43% of the FMA peak."""
    n, c, h, w, m, k, ho, wo, _, og = geometry
    length, cpg = ho * wo, c // og
    pix = lambda a: em.const(np.ascontiguousarray(a.reshape(k, length).T).astype(ft), "base")  # [length, k]
    off = em.reshape(node.input[2], [n, og, k, 2, length])
    pos = []
    for axis, base in ((0, base_y), (1, base_x)):  # ONNX's offsets are (y, x) pairs
        o = em.op("Transpose", [em.reshape(em.take(off, axis, axis=3), [n, og, k, length])], perm=[0, 1, 3, 2])
        pos.append(em.op("Add", [o, pix(base)]))  # [n, og, length, k], in pixels
    lo = [em.op("Floor", [p]) for p in pos]
    frac = [em.op("Sub", [p, f]) for p, f in zip(pos, lo)]
    mask = None
    if len(node.input) > 4 and node.input[4]:
        mask = em.op("Transpose", [em.reshape(node.input[4], [n, og, k, length])], perm=[0, 1, 3, 2])
    one, zero = em.const(np.array(1.0, ft), "one"), em.const(np.array(0.0, ft), "zero")
    # the first row of each (image, offset group) in the gathered table
    start = (np.arange(n)[:, None] * og + np.arange(og)[None, :]) * (h * w)
    start = em.const(start.reshape(n, og, 1, 1).astype(ft), "start")
    table = em.op("Transpose", [em.reshape(node.input[0], [n, og, cpg, h, w])], perm=[0, 1, 3, 4, 2])
    table = em.reshape(table, [n * og * h * w, cpg])
    # each axis' two neighbours once: the coordinate, whether it is inside the image, its bilinear factor
    near = []
    for a, size in ((0, h), (1, w)):
        step = [lo[a], em.op("Add", [lo[a], em.const(np.array(1, ft), "d")])]
        factor = [em.op("Sub", [one, frac[a]]), frac[a]]
        near.append([(c, _inside(em, c, size, ft), f) for c, f in zip(step, factor)])
    rows_y = [em.op("Add", [em.op("Mul", [c, em.const(np.array(w, ft), "w")]), start]) for c, _, _ in near[0]]
    total = None
    for (_, in_y, fy), row_y in zip(near[0], rows_y):
        for xx, in_x, fx in near[1]:
            inside = em.op("And", [in_y, in_x])
            weight = em.op("Mul", [fy, fx])
            weight = em.op("Mul", [weight, mask]) if mask else weight
            weight = em.op("Where", [inside, weight, zero])  # a NaN or far offset reads row 0 times 0
            row = em.op("Cast", [em.op("Where", [inside, em.op("Add", [row_y, xx]), start])], to=TensorProto.INT64)
            taken = em.op("Gather", [table, row], axis=0)  # [n, og, length, k, cpg]
            term = em.op("Mul", [taken, em.reshape(weight, [n, og, length, k, 1])])
            total = term if total is None else em.op("Add", [total, term])
    rows = total if og == 1 else em.op("Transpose", [total], perm=[0, 2, 1, 3, 4])  # [n, length, og, k, cpg]
    rows = em.reshape(rows, [n, length, og * k * cpg])
    # the weight [m, c, kh, kw] as [(og, k, cpg), m]
    wt = em.op("Transpose", [em.reshape(node.input[1], [m, og, cpg, k])], perm=[1, 3, 2, 0])
    y = em.op("MatMul", [rows, em.reshape(wt, [og * k * cpg, m])])  # [n, length, m]
    return em.reshape(em.op("Transpose", [y], perm=[0, 2, 1]), [n, m, ho, wo])


def _inside(em: Emitter, v: str, size: int, ft) -> str:
    """0 <= v <= size - 1 (false for NaN)"""
    ge = em.op("GreaterOrEqual", [v, em.const(np.array(0.0, ft), "zero")])
    return em.op("And", [ge, em.op("LessOrEqual", [v, em.const(np.array(size - 1, ft), "last")])])


def _grid_sample_columns(node, em: Emitter, geometry, base_y, base_x, ft) -> str:
    """Grouped convs: each tap's input sampled by one GridSample over every offset group (channel-major), the
    grouped convolution one batched MatMul with the weight on the left."""
    n, c, h, w, m, k, ho, wo, g, og = geometry
    length, cg = ho * wo, c // g
    # each tap's sampling position without offset, normalised as GridSample (align_corners=0) reads it:
    # pixel p -> (2p + 1) / size - 1, so the offset (in pixels) is added after scaling by 2 / size
    off = em.reshape(node.input[2], [n, og, k, 2, ho, wo])
    grid = []
    for axis, base, size in ((1, base_x, w), (0, base_y, h)):  # GridSample's grid is (x, y)
        o = em.reshape(em.take(off, axis, axis=3), [n, og, k, ho, wo])
        pos = em.op("Add", [o, em.const(base.astype(ft), "base")])
        norm = em.op("Mul", [pos, em.const(np.array(2.0 / size, ft), "scale")])
        norm = em.op("Add", [norm, em.const(np.array(1.0 / size - 1.0, ft), "shift")])
        grid.append(em.reshape(norm, [n * og, k * ho, wo, 1]))
    grid = em.op("Concat", grid, axis=-1)
    x = em.reshape(node.input[0], [n * og, c // og, h, w])
    mode = "linear" if getattr(em, "opset", 19) >= 20 else "bilinear"
    taps = em.op("GridSample", [x, grid], mode=mode, padding_mode="zeros", align_corners=0)
    taps = em.reshape(taps, [n, og, c // og, k, length])
    if len(node.input) > 4 and node.input[4]:
        taps = em.op("Mul", [taps, em.reshape(node.input[4], [n, og, 1, k, length])])
    cols = em.reshape(taps, [n, g, cg * k, length])
    y = em.op("MatMul", [em.reshape(node.input[1], [g, m // g, cg * k]), cols])
    return em.reshape(y, [n, m, ho, wo])


REWRITES = {"DeformConv": deform_conv}
