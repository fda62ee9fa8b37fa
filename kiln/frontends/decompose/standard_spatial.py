"""Standard-domain spatial ops whose TVM 0.27 converter is missing or wrong, written out in ops TVM converts
correctly (exact ONNX semantics: onnx/reference/ops/op_*.py): ConvTranspose's output_shape, Col2Im (missing),
MaxPool's Indices output, Resize/Upsample modes TVM gets wrong. Split from standard_math.py (its helpers)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ...errors import UnsupportedModelError
from .emitter import Emitter
from .standard_math import FLOATS, MAX_CONST, attrs_of, axis_of, const_int_of, dtype_of, np_of, opset_of, reduce_of


def conv_transpose(node, em: Emitter, shapes, consts, where):
    """output_shape given: the pads it implies (onnx's reference), the negative ones (output larger than
    the natural one) as zero padding after the convolution."""
    a = attrs_of(node)
    if "output_shape" not in a:
        return False
    xs, ws = shapes.get(node.input[0]), shapes.get(node.input[1])
    if xs is None or ws is None:
        return False
    nd = len(xs) - 2
    out_shape = list(a.pop("output_shape"))[-nd:]
    strides, dil = a.get("strides", [1] * nd), a.get("dilations", [1] * nd)
    kernel = a.get("kernel_shape", list(ws[2:]))
    opad = a.pop("output_padding", [0] * nd)
    auto = a.pop("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    a.pop("pads", None)
    begin, end = [], []
    for i in range(nd):
        total = strides[i] * (xs[i + 2] - 1) + opad[i] + ((kernel[i] - 1) * dil[i] + 1) - out_shape[i]
        lo, hi = (total // 2, total - total // 2) if auto == "SAME_UPPER" else (total - total // 2, total // 2)
        begin.append(lo)
        end.append(hi)
    pads = [max(p, 0) for p in begin + end]
    # output larger than the natural one at the end: more output_padding (TVM takes it below the stride)
    fits = [o + max(-e, 0) < max(s, d) for o, e, s, d in zip(opad, end, strides, dil)]
    grow_end = [0 if f else max(-e, 0) for f, e in zip(fits, end)]
    opad = [o + max(-e, 0) if f else o for o, e, f in zip(opad, end, fits)]
    grow = [0, 0] + [max(-p, 0) for p in begin] + [0, 0] + grow_end
    y = em.op("ConvTranspose", list(node.input), pads=pads, output_padding=opad, **a)
    if any(grow):
        em.op("Pad", [y, em.const(np.array(grow, np.int64), "pads")], out=node.output[0])
    else:
        em.op("Identity", [y], out=node.output[0])
    return True


def col2im(node, em: Emitter, shapes, consts, where):
    """A MatMul with the constant 0/1 matrix that sends each (block offset, block position) to its image
    pixel (out-of-image ones nowhere): (N, C, K*L) @ S(K*L, prod(image)), summing the overlaps."""
    shape = shapes.get(node.input[0])
    img, blk = const_int_of(node.input[1], consts), const_int_of(node.input[2], consts)
    if img is None or blk is None:
        return False  # fed at run time: tvm_col2im.py's converter takes them
    if shape is None:
        raise UnsupportedModelError(
            "Col2Im needs an input of known shape", where=where, fix="pin the input's shape (--input-shape)"
        )
    a = attrs_of(node)
    nd = len(img)
    dil, strides = a.get("dilations", [1] * nd), a.get("strides", [1] * nd)
    pads = a.get("pads", [0] * 2 * nd)
    n, ck, L = shape
    K = int(np.prod(blk))
    c = ck // K
    grid = [
        (int(img[i]) + pads[i] + pads[i + nd] - dil[i] * (int(blk[i]) - 1) - 1) // strides[i] + 1 for i in range(nd)
    ]
    P = int(np.prod(img))
    if K * L * P > MAX_CONST:
        raise UnsupportedModelError(
            f"Col2Im too large to lower ({K}x{L} blocks onto {P} pixels)", where=where, fix="use a smaller image"
        )
    S = np.zeros((K, L, P), np_of(dtype_of(node.input[0], consts) or TensorProto.FLOAT))
    koff = np.stack(np.unravel_index(np.arange(K), tuple(int(b) for b in blk)), -1)  # [K, nd]
    lpos = np.stack(np.unravel_index(np.arange(L), tuple(grid)), -1)  # [L, nd]
    coord = lpos[None] * np.array(strides) - np.array(pads[:nd]) + koff[:, None] * np.array(dil)  # [K, L, nd]
    inside = np.all((coord >= 0) & (coord < img), -1)
    kk, ll = np.nonzero(inside)
    S[kk, ll, np.ravel_multi_index(tuple(coord[kk, ll].T), tuple(int(v) for v in img))] = 1
    x = em.reshape(node.input[0], [n, c, K * L])
    y = em.op("MatMul", [x, em.const(S.reshape(K * L, P), "scatter")])
    em.op("Reshape", [y, em.const(np.array([n, c] + [int(v) for v in img], np.int64))], out=node.output[0])
    return True


def max_pool(node, em: Emitter, shapes, consts, where):
    """With the Indices output: the windows gathered from the -inf-padded, flattened input through a
    constant index map, ArgMax over each window, the flat (row-major, or column-major with
    storage_order=1) index of the winner looked up in a second constant map."""
    if len(node.output) < 2 or not node.output[1]:
        return False
    shape, yshape = shapes.get(node.input[0]), shapes.get(node.output[0])
    t = dtype_of(node.input[0], consts)
    if shape is None or yshape is None or t is None:
        return False
    a = attrs_of(node)
    nd = len(shape) - 2
    kernel = a["kernel_shape"]
    strides, dil = a.get("strides", [1] * nd), a.get("dilations", [1] * nd)
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    out = list(yshape[2:])
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [max((out[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - shape[i + 2], 0) for i in range(nd)]
        lo = [tt // 2 if auto == "SAME_UPPER" else tt - tt // 2 for tt in total]
    else:
        lo = list(a.get("pads", [0] * 2 * nd))[:nd]
    K, O, spatial = int(np.prod(kernel)), int(np.prod(out)), tuple(shape[2:])
    H = int(np.prod(spatial))
    if K * O > MAX_CONST:
        raise UnsupportedModelError(
            "MaxPool with Indices too large to lower", where=where, fix="drop the Indices output"
        )
    koff = np.stack(np.unravel_index(np.arange(K), tuple(kernel)), -1)
    opos = np.stack(np.unravel_index(np.arange(O), tuple(out)), -1)
    coord = opos[:, None] * np.array(strides) - np.array(lo) + koff[None] * np.array(dil)  # [O, K, nd]
    inside = np.all((coord >= 0) & (coord < np.array(spatial)), -1)
    clipped = np.clip(coord, 0, np.array(spatial) - 1)
    flat = np.ravel_multi_index(tuple(clipped.reshape(-1, nd).T), spatial).reshape(O, K)
    gidx = np.where(inside, flat, H)  # H: the -inf pad element
    order = "F" if a.get("storage_order", 0) else "C"
    n, c = shape[:2]
    xf = em.reshape(node.input[0], [n, c, H])
    pad = em.const(np.full((n, c, 1), -np.inf, np_of(t)), "ninf")
    xf = em.op("Concat", [xf, pad], axis=2)
    win = em.op("Gather", [xf, em.const(gidx.astype(np.int64), "win")], axis=2)  # [n, c, O, K]
    arg = em.op("ArgMax", [win], axis=3, keepdims=1)  # [n, c, O, 1]
    em.op(
        "Reshape",
        [reduce_of(em, "ReduceMax", win, [3], 0), em.const(np.array([n, c] + out, np.int64))],
        out=node.output[0],
    )
    # flat index of each (O, K) candidate in the whole input tensor, without the n, c part
    sp = np.ravel_multi_index(tuple(clipped.reshape(-1, nd).T), spatial, order=order).reshape(O, K)
    loc = em.op(
        "GatherElements",
        [em.op("Expand", [em.const(sp.astype(np.int64), "loc"), em.const(np.array([n, c, O, K], np.int64))]), arg],
        axis=3,
    )
    base = np.arange(n * c, dtype=np.int64).reshape(n, c, 1, 1) * H
    if order == "F":  # column-major over (n, c, spatial...): n + N*(c + C*spatial_F)
        base = (np.arange(n)[:, None] + n * np.arange(c)[None, :]).reshape(n, c, 1, 1).astype(np.int64)
        loc = em.op("Mul", [loc, em.const(np.array(n * c, np.int64))])
    em.op(
        "Reshape",
        [em.op("Add", [loc, em.const(base, "base")]), em.const(np.array([n, c] + out, np.int64))],
        out=node.output[1],
    )
    return True


# ------------------------------------------------------------------------------------------ resize


def _resize_ref(node, opset: int, data: np.ndarray, params: list, extrapolation: float | None = None) -> np.ndarray:
    """onnx's reference Resize (or Upsample) of `data` with the node's attributes and constant params."""
    from onnx.reference import ReferenceEvaluator

    names = [f"p{k}" if p is not None else "" for k, p in enumerate(params)]
    while names and not names[-1]:
        names.pop()
    n = onnx.NodeProto()
    n.CopyFrom(node)
    del n.input[:], n.output[:]
    n.input.extend(["x"] + names)
    n.output.append("y")
    if extrapolation is not None:
        for a in n.attribute:
            if a.name == "extrapolation_value":
                a.f = extrapolation
    inits = [onnx.numpy_helper.from_array(p, nm) for p, nm in zip(params, names) if p is not None]
    g = helper.make_graph(
        [n],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, list(data.shape))],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return np.asarray(ReferenceEvaluator(m).run(None, {"x": data.astype(np.float64)})[0])


def resize(node, em: Emitter, shapes, consts, where):
    """Resize is separable and linear in x (plus the extrapolation value): each resized axis is a constant
    (out, in) matrix, probed from onnx's reference Resize, applied as a Gather (nearest) or a MatMul.
    Kept on TVM's converter where that one is right: 4-D, nearest/linear, integer upsampling factors."""
    shape, oshape = shapes.get(node.input[0]), shapes.get(node.output[0])
    inputs = list(node.input[1:]) + [""] * (3 - len(node.input[1:]))
    if node.op_type == "Upsample":
        inputs = [""] + inputs[:1] + [""]
    missing = [i for i in inputs if i and i not in consts]
    if missing:
        return False  # roi/scales/sizes fed at run time: tvm_resize.py's converter takes them
    t = dtype_of(node.input[0], consts)
    if shape is None or oshape is None or t is None:
        return False
    a = attrs_of(node)
    dec = lambda v: v.decode() if isinstance(v, bytes) else v
    mode, ctm = dec(a.get("mode", b"nearest")), dec(a.get("coordinate_transformation_mode", b"half_pixel"))
    params = [np.asarray(consts[i]) if i and np.asarray(consts[i]).size else None for i in inputs]
    if node.op_type == "Upsample":
        params = params[1:2]
    rank = len(shape)
    ratios = [o / i for o, i in zip(oshape, shape)]
    simple = (
        rank == 4
        and mode in ("nearest", "linear")
        and "axes" not in a
        and not a.get("antialias", 0)
        and dec(a.get("keep_aspect_ratio_policy", b"stretch")) == "stretch"
        and ctm != "half_pixel_symmetric"
        and ctm != "tf_crop_and_resize"
        and all(r >= 1 and r == int(r) for r in ratios)
        and node.op_type == "Resize"
    )
    if simple:
        return False
    if t not in FLOATS and mode != "nearest":
        return False
    opset = opset_of()
    try:
        ones = _resize_ref(node, opset, np.ones(shape), params, 0.0)  # 1 inside, 0 where extrapolated
        mats = {i: _axis_matrix(node, opset, shape, params, i) for i in range(rank)}
    except Exception:
        return False
    mats = {i: M for i, M in mats.items() if M.shape[0] != M.shape[1] or not np.allclose(M, np.eye(M.shape[0]))}
    x = node.input[0]
    if not mats:
        em.op("Identity", [x], out=node.output[0])
        return True
    onehot = all(np.all((M == 0) | (M == 1)) and np.all(M.sum(1) == 1) for M in mats.values())
    if t not in FLOATS and not onehot:
        return False
    y = x
    for i, M in mats.items():
        if onehot:
            y = em.op("Gather", [y, em.const(M.argmax(1).astype(np.int64), "idx")], axis=i)
            continue
        perm = [k for k in range(rank) if k != i] + [i]
        inv = list(np.argsort(perm))
        yt = em.op("Transpose", [y], perm=perm)
        yt = em.op("MatMul", [yt, em.const(M.T.astype(np_of(t)), "interp")])
        y = em.op("Transpose", [yt], perm=inv)
    ev = float(a.get("extrapolation_value", 0.0))
    if ctm == "tf_crop_and_resize" and ev != 0 and not np.all(ones == 1):
        em.op("Add", [y, em.const((ev * (1 - ones)).astype(np_of(t)), "extrap")], out=node.output[0])
    else:
        em.op("Identity", [y], out=node.output[0])
    return True


def _probe_params(params: list, shape, node, axis: int, n: int, probe_shape) -> list:
    """The node's params for a probe of shape `probe_shape`: sizes of the axes probed at size 1 become 1."""
    out = list(params)
    sizes = out[2] if node.op_type == "Resize" and len(out) > 2 else None
    if sizes is not None:
        axes = attrs_of(node).get("axes") or list(range(len(shape)))
        s = sizes.copy()
        for k, ax in enumerate(axes):
            ax = axis_of(ax, len(shape))
            if probe_shape[ax] != shape[ax]:
                s[k] = probe_shape[ax]
        out[2] = s
    return out


def _identity_axis(node, shape, params: list, k: int) -> bool:
    """Whether the params leave axis k alone by their values (scale 1, or its own size): probed at size 1."""
    axes = [axis_of(ax, len(shape)) for ax in (attrs_of(node).get("axes") or range(len(shape)))]
    if k not in axes:
        return True
    j = axes.index(k)
    scales = params[1] if node.op_type == "Resize" else params[0]
    sizes = params[2] if node.op_type == "Resize" else None
    if scales is not None and scales.size:
        return float(scales[j]) == 1.0
    return sizes is not None and int(sizes[j]) == shape[k]


def _axis_matrix(node, opset: int, shape, params: list, i: int) -> np.ndarray:
    """(out_i, in_i): the reference Resize of one-hot probes along axis i, every other axis size 1."""
    n = shape[i]
    probe = [shape[k] if k == i or not _identity_axis(node, shape, params, k) else 1 for k in range(len(shape))]
    pp = _probe_params(params, shape, node, i, n, probe)
    r1 = _resize_ref(node, opset, np.ones(probe), pp, 0.0)
    at = list(np.unravel_index(int(np.argmax(r1)), r1.shape))  # a sample inside the image on the other axes
    at[i] = slice(None)
    cols = []
    for j in range(n):
        e = np.zeros(n)
        e[j] = 1
        e = np.ones(probe) * e.reshape([n if k == i else 1 for k in range(len(shape))])
        cols.append(_resize_ref(node, opset, e, pp, 0.0)[tuple(at)])
    return np.stack(cols, 1)


REWRITES = {
    "ConvTranspose": conv_transpose,
    "Col2Im": col2im,
    "MaxPool": max_pool,
    "Resize": resize,
    "Upsample": resize,
}
