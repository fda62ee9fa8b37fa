"""DeformConv (opset 19; DCN detectors, torchvision.ops.deform_conv2d) in ops TVM converts: each kernel tap's
input, bilinearly sampled at the tap's position plus its learned offset (zero outside the image), is one
GridSample over every offset group; the taps times their modulation mask are the columns of an im2col, and the
grouped convolution is one batched MatMul with the weight (onnx/reference/ops/op_deform_conv.py's semantics)."""

from __future__ import annotations

import numpy as np

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
    (n, c, h, w), (m, cg, kh, kw), (_, _, ho, wo) = xs, ws, offs
    g, og = a.get("group", 1), a.get("offset_group", 1)
    sh, sw = a.get("strides", [1, 1])
    dh, dw = a.get("dilations", [1, 1])
    ph, pw = a.get("pads", [0, 0, 0, 0])[:2]
    k, length = kh * kw, ho * wo
    ty = dtype_of(node.input[0], consts)
    ft = np_of(ty) if ty in FLOATS else np.float32
    # each tap's sampling position without offset, normalised as GridSample (align_corners=0) reads it:
    # pixel p -> (2p + 1) / size - 1, so the offset (in pixels) is added after scaling by 2 / size
    i, j = np.divmod(np.arange(k), kw)
    base_y = (np.arange(ho)[None, :, None] * sh - ph + i[:, None, None] * dh) * np.ones((1, 1, wo))
    base_x = (np.arange(wo)[None, None, :] * sw - pw + j[:, None, None] * dw) * np.ones((1, ho, 1))
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
    y = em.reshape(y, [n, m, ho, wo])
    if len(node.input) > 3 and node.input[3]:
        y = em.op("Add", [y, em.reshape(node.input[3], [1, m, 1, 1])])
    em.op("Identity", [y], out=node.output[0])
    return True


REWRITES = {"DeformConv": deform_conv}
