"""Standard-domain math, normalization and layout ops whose TVM 0.27 converter is missing or wrong,
written out in ops TVM converts correctly (exact ONNX semantics: onnx/reference/ops/op_*.py).

Missing in TVM: CumProd, LpNormalization, Col2Im, Det, ReverseSequence. Wrong or incomplete in TVM:
Pow with mixed or integer operands (TVM's power is float-only, same-dtype), Mod with fmod=0 on floats
(infinite divisors), IsInf's detect_positive/detect_negative, Cosh/Sinh (no TIR intrinsic at build),
EyeLike's dtype attribute, Dropout's mask output, SpaceToDepth's CRD mode, BatchNormalization in
training mode, ConvTranspose's output_shape, MaxPool's Indices output. Equal on strings is refused.

Every rewrite relies on static shapes (the importer pins them first); a rewrite returns False to keep
TVM's converter where that one is right (or where the shapes it needs are unknown)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ...errors import UnsupportedModelError
from .emitter import CURRENT_MODEL, Emitter

FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
MAX_CONST = 1 << 22  # elements of a constant a rewrite builds (Col2Im's scatter matrix, MaxPool's index map)

_TYPES: list = [None, None]  # [model, {value name: elem type}]: inferred once per decompose() call


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _model() -> onnx.ModelProto | None:
    """The model decompose() is rewriting (the rewrite interface passes shapes, not element types)."""
    return CURRENT_MODEL.get()


def _dtype(name: str, consts: dict) -> int | None:
    """ONNX element type of value `name` (None when unknown)."""
    if name in consts:
        return helper.np_dtype_to_tensor_dtype(np.asarray(consts[name]).dtype)
    model = _model()
    if model is None:
        return None
    if _TYPES[0] is not model:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:
            inferred = model
        g = inferred.graph
        types = {
            v.name: v.type.tensor_type.elem_type
            for v in list(g.value_info) + list(g.input) + list(g.output)
            if v.type.HasField("tensor_type")
        }
        types.update({t.name: t.data_type for t in g.initializer})
        _TYPES[:] = [model, types]
    return _TYPES[1].get(name) or None


def _opset() -> int:
    m = _model()
    return 1 if m is None else next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 1)


def _reduce(em: Emitter, op: str, x: str, axes: list[int], keepdims: int) -> str:
    """A Reduce* over `axes` as the model's opset spells it (axes an input from opset 18, 13 for ReduceSum)."""
    if _opset() >= (13 if op == "ReduceSum" else 18):
        return em.op(op, [x, em.const(np.array(axes, np.int64), "axes")], keepdims=keepdims)
    return em.op(op, [x], axes=list(axes), keepdims=keepdims)


def _np(t: int):
    return helper.tensor_dtype_to_np_dtype(t)


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _const_int(name: str, consts: dict):
    return None if name not in consts else np.asarray(consts[name]).astype(np.int64)


# ------------------------------------------------------------------------------------------ elementwise


def pow_(node, em: Emitter, shapes, consts, where):
    """TVM's power takes two operands of one float dtype: cast the exponent to the base's float type, and
    compute an integer base in float64 (exact for the integers a pow of int64 can hold), rounded back."""
    tx, ty = _dtype(node.input[0], consts), _dtype(node.input[1], consts)
    if tx is None or ty is None or (tx == ty and tx in FLOATS):
        return False
    if tx in FLOATS:
        em.op("Pow", [node.input[0], em.op("Cast", [node.input[1]], to=tx)], out=node.output[0])
        return True
    xf = em.op("Cast", [node.input[0]], to=TensorProto.DOUBLE)
    yf = em.op("Cast", [node.input[1]], to=TensorProto.DOUBLE)
    p = em.op("Pow", [xf, yf])
    em.op("Cast", [em.op("Round", [p]) if ty not in FLOATS else p], to=tx, out=node.output[0])
    return True


def mod(node, em: Emitter, shapes, consts, where):
    """fmod=0 on floats is Python's modulo (the result takes the divisor's sign): C's fmod (fmod=1, exact,
    right for infinite divisors), moved into the divisor's sign where it is nonzero and differs."""
    t = _dtype(node.input[0], consts)
    if _attrs(node).get("fmod", 0) or t not in FLOATS:
        return False
    x, y = node.input
    m = em.op("Mod", [x, y], fmod=1)
    zero = em.const(np.zeros((), _np(t)), "zero")
    fix = em.op(
        "And",
        [em.op("Not", [em.op("Equal", [m, zero])]), em.op("Xor", [em.op("Less", [y, zero]), em.op("Less", [m, zero])])],
    )
    em.op("Where", [fix, em.op("Add", [m, y]), m], out=node.output[0])
    return True


def is_inf(node, em: Emitter, shapes, consts, where):
    """detect_positive / detect_negative honoured (TVM's converter ignores them)."""
    a = _attrs(node)
    pos, neg = a.get("detect_positive", 1), a.get("detect_negative", 1)
    if pos and neg:
        return False
    t = _dtype(node.input[0], consts)
    if t is None:
        return False
    x = node.input[0]
    if not pos and not neg:  # nothing to detect: all false (shape-preserving, NaN-safe)
        em.op("And", [em.op("IsInf", [x]), em.const(np.zeros((), bool), "false")], out=node.output[0])
        return True
    em.op("Equal", [x, em.const(np.array(np.inf if pos else -np.inf, _np(t)), "inf")], out=node.output[0])
    return True


def _hyperbolic(sign: float):
    def rewrite(node, em: Emitter, shapes, consts, where):
        """(exp(x) +- exp(-x)) / 2: TVM's cosh/sinh have no TIR intrinsic to build."""
        t = _dtype(node.input[0], consts)
        if t is None:
            return False
        x = node.input[0]
        e, en = em.op("Exp", [x]), em.op("Exp", [em.op("Neg", [x])])
        s = em.op("Add" if sign > 0 else "Sub", [e, en])
        em.op("Mul", [s, em.const(np.array(0.5, _np(t)), "half")], out=node.output[0])
        return True

    return rewrite


def equal(node, em: Emitter, shapes, consts, where):
    if _dtype(node.input[0], consts) == TensorProto.STRING:
        raise UnsupportedModelError(
            "Equal on string tensors is not supported (no string type in TVM)",
            where=where,
            fix="compare the strings before the model, or encode them as ids",
        )
    return False


# ------------------------------------------------------------------------------------------ scans, norms


def cum_prod(node, em: Emitter, shapes, consts, where):
    """y[i] = prod of x[j] over j <= i (exclusive: j < i; reverse: j >= i): x broadcast against a constant
    lower-triangular mask along the axis, the masked-out factors set to 1, then ReduceProd."""
    shape, axis_v = shapes.get(node.input[0]), _const_int(node.input[1], consts)
    t = _dtype(node.input[0], consts)
    if axis_v is None:
        raise UnsupportedModelError(
            "CumProd needs a constant axis",
            where=where,
            fix="export it as an initializer, or freeze that input (--freeze-input)",
        )
    if shape is None or t is None:
        return False
    a = _attrs(node)
    rank = len(shape)
    axis = _axis(int(axis_v.reshape(-1)[0]), rank)
    n = shape[axis]
    if n * int(np.prod(shape, dtype=np.int64)) > MAX_CONST * 4:
        raise UnsupportedModelError(
            f"CumProd over an axis of {n} is too large to unroll", where=where, fix="use a shorter axis"
        )
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    rev, exc = a.get("reverse", 0), a.get("exclusive", 0)
    mask = (j > i if exc else j >= i) if rev else (j < i if exc else j <= i)
    # x: [..., n(axis), ...] -> [..., 1, n, ...] so that mask [n(i), n(j)] lines up on (axis, axis + 1)
    xu = em.op("Unsqueeze", [node.input[0], em.const(np.array([axis], np.int64), "ax")])
    m = mask.reshape((n, n) + (1,) * (rank - axis - 1))
    sel = em.op("Where", [em.const(m, "mask"), xu, em.const(np.ones((), _np(t)), "one")])
    em.op("Identity", [_reduce(em, "ReduceProd", sel, [axis + 1], 0)], out=node.output[0])
    return True


def lp_normalization(node, em: Emitter, shapes, consts, where):
    """x / ||x||_p along axis (p 1 or 2), as onnx's reference computes it."""
    a = _attrs(node)
    p, axis = a.get("p", 2), a.get("axis", -1)
    if p not in (1, 2):
        raise UnsupportedModelError(
            f"LpNormalization with p={p} (ONNX allows 1 or 2)", where=where, fix="use p=1 or p=2"
        )
    t = _dtype(node.input[0], consts)
    if t is None:
        return False
    norm = _reduce(em, "ReduceL1" if p == 1 else "ReduceL2", node.input[0], [axis], 1)
    zero = em.const(np.zeros((), _np(t)), "zero")
    em.op("Where", [em.op("Equal", [norm, zero]), zero, em.op("Div", [node.input[0], norm])], out=node.output[0])
    return True


def batch_norm(node, em: Emitter, shapes, consts, where):
    """training_mode=1: normalise with the batch's own mean and (biased) variance; the running statistics
    come out as input_mean * momentum + batch_mean * (1 - momentum) (same for var)."""
    a = _attrs(node)
    if not a.get("training_mode", 0):
        return False
    shape, t = shapes.get(node.input[0]), _dtype(node.input[0], consts)
    if shape is None or t is None:
        return False
    x, scale, bias, mean, var = node.input[:5]
    eps, mom, rank, dt = a.get("epsilon", 1e-5), a.get("momentum", 0.9), len(shape), _np(t)
    axes = [0] + list(range(2, rank))
    cshape = em.const(np.array([1, -1] + [1] * (rank - 2), np.int64), "cshape")
    bmean = _reduce(em, "ReduceMean", x, axes, 1)
    d = em.op("Sub", [x, bmean])
    bvar = _reduce(em, "ReduceMean", em.op("Mul", [d, d]), axes, 1)
    inv = em.op("Sqrt", [em.op("Add", [bvar, em.const(np.array(eps, dt), "eps")])])
    y = em.op("Div", [d, inv])
    y = em.op("Mul", [y, em.op("Reshape", [scale, cshape])])
    em.op("Add", [y, em.op("Reshape", [bias, cshape])], out=node.output[0])
    flat = em.const(np.array([-1], np.int64), "flat")
    for k, (run, cur) in enumerate(((mean, bmean), (var, bvar)), start=1):
        if len(node.output) > k and node.output[k]:
            c = em.op("Reshape", [cur, flat])
            em.op(
                "Add",
                [
                    em.op("Mul", [run, em.const(np.array(mom, dt), "mom")]),
                    em.op("Mul", [c, em.const(np.array(1 - mom, dt), "mom1")]),
                ],
                out=node.output[k],
            )
    return True


def det(node, em: Emitter, shapes, consts, where):
    """Cofactor expansion along the first row, unrolled for n <= 4 (ONNX has no LU)."""
    shape = shapes.get(node.input[0])
    if shape is None:
        return False
    n = shape[-1]
    if n > 4 or n != shape[-2]:
        raise UnsupportedModelError(
            f"Det of {n}x{shape[-2]} matrices: only square ones up to 4x4",
            where=where,
            fix="compute the determinant outside the model",
        )
    batch = list(shape[:-2])
    flat = em.reshape(node.input[0], batch + [n * n])
    el = {}

    def e(r, c):
        if (r, c) not in el:
            el[r, c] = em.op("Gather", [flat, em.const(np.array(r * n + c, np.int64), "idx")], axis=len(batch))
        return el[r, c]

    def minor(rows, cols):
        if len(rows) == 1:
            return e(rows[0], cols[0])
        acc = None
        for k, c in enumerate(cols):
            term = em.op("Mul", [e(rows[0], c), minor(rows[1:], cols[:k] + cols[k + 1 :])])
            acc = term if acc is None else em.op("Add" if k % 2 == 0 else "Sub", [acc, term])
        return acc

    res = minor(list(range(n)), list(range(n)))
    em.op("Identity", [res], out=node.output[0])
    return True


# ------------------------------------------------------------------------------------------ layout


def reverse_sequence(node, em: Emitter, shapes, consts, where):
    """GatherElements along time with src[t, b] = len[b] - 1 - t where t < len[b], else t."""
    shape = shapes.get(node.input[0])
    if shape is None:
        return False
    a = _attrs(node)
    rank = len(shape)
    ta, ba = _axis(a.get("time_axis", 0), rank), _axis(a.get("batch_axis", 1), rank)
    T, B = shape[ta], shape[ba]
    tshape, bshape = [1] * rank, [1] * rank
    tshape[ta], bshape[ba] = T, B
    t = em.const(np.arange(T, dtype=np.int64).reshape(tshape), "t")
    lens = em.reshape(em.op("Cast", [node.input[1]], to=TensorProto.INT64), bshape)
    rev = em.op("Sub", [em.op("Sub", [lens, em.const(np.array(1, np.int64), "one")]), t])
    src = em.op("Where", [em.op("Less", [t, lens]), rev, t])
    src = em.op("Expand", [src, em.const(np.array(shape, np.int64), "shape")])
    em.op("GatherElements", [node.input[0], src], axis=ta, out=node.output[0])
    return True


def space_to_depth(node, em: Emitter, shapes, consts, where):
    """mode CRD (opset 28): channel-major, block offsets minor; TVM's converter only knows DCR."""
    a = _attrs(node)
    mode = a.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    shape = shapes.get(node.input[0])
    if mode != "CRD" or shape is None:
        return False
    bs = a["blocksize"]
    b, c, h, w = shape
    x = em.reshape(node.input[0], [b, c, h // bs, bs, w // bs, bs])
    x = em.op("Transpose", [x], perm=[0, 1, 3, 5, 2, 4])
    em.op("Reshape", [x, em.const(np.array([b, c * bs * bs, h // bs, w // bs], np.int64))], out=node.output[0])
    return True


def eye_like(node, em: Emitter, shapes, consts, where):
    """A constant: the output depends only on the (static) input shape, k and dtype."""
    shape = shapes.get(node.input[0])
    if shape is None:
        return False
    a = _attrs(node)
    t = a.get("dtype") or _dtype(node.input[0], consts)
    if t is None:
        return False
    val = np.eye(shape[0], shape[1], k=a.get("k", 0)).astype(_np(t))
    em.op("Identity", [em.const(val, "eye")], out=node.output[0])
    return True


def dropout(node, em: Emitter, shapes, consts, where):
    """Inference Dropout (training_mode absent or constant false): identity, and a mask of all true."""
    tm = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if tm is not None and (tm not in consts or bool(np.asarray(consts[tm]).reshape(-1)[0])):
        return False
    shape = shapes.get(node.input[0])
    if len(node.output) < 2 or not node.output[1] or shape is None:
        return False
    em.op("Identity", [node.input[0]], out=node.output[0])
    em.op("Identity", [em.const(np.ones(shape, bool), "mask")], out=node.output[1])
    return True


def conv_transpose(node, em: Emitter, shapes, consts, where):
    """output_shape given: the pads it implies (onnx's reference), the negative ones (output larger than
    the natural one) as zero padding after the convolution."""
    a = _attrs(node)
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
    img, blk = _const_int(node.input[1], consts), _const_int(node.input[2], consts)
    if shape is None or img is None or blk is None:
        raise UnsupportedModelError(
            "Col2Im needs constant image_shape and block_shape",
            where=where,
            fix="export them as initializers, or freeze those inputs (--freeze-input)",
        )
    a = _attrs(node)
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
    S = np.zeros((K, L, P), _np(_dtype(node.input[0], consts) or TensorProto.FLOAT))
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
    t = _dtype(node.input[0], consts)
    if shape is None or yshape is None or t is None:
        return False
    a = _attrs(node)
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
    pad = em.const(np.full((n, c, 1), -np.inf, _np(t)), "ninf")
    xf = em.op("Concat", [xf, pad], axis=2)
    win = em.op("Gather", [xf, em.const(gidx.astype(np.int64), "win")], axis=2)  # [n, c, O, K]
    arg = em.op("ArgMax", [win], axis=3, keepdims=1)  # [n, c, O, 1]
    em.op(
        "Reshape",
        [_reduce(em, "ReduceMax", win, [3], 0), em.const(np.array([n, c] + out, np.int64))],
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
        raise UnsupportedModelError(
            f"{node.op_type} needs constant roi/scales/sizes ({', '.join(missing)})",
            where=where,
            fix="export them as initializers, or freeze them (--freeze-input)",
        )
    t = _dtype(node.input[0], consts)
    if shape is None or oshape is None or t is None:
        return False
    a = _attrs(node)
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
    opset = _opset()
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
        yt = em.op("MatMul", [yt, em.const(M.T.astype(_np(t)), "interp")])
        y = em.op("Transpose", [yt], perm=inv)
    ev = float(a.get("extrapolation_value", 0.0))
    if ctm == "tf_crop_and_resize" and ev != 0 and not np.all(ones == 1):
        em.op("Add", [y, em.const((ev * (1 - ones)).astype(_np(t)), "extrap")], out=node.output[0])
    else:
        em.op("Identity", [y], out=node.output[0])
    return True


def _probe_params(params: list, shape, node, axis: int, n: int, probe_shape) -> list:
    """The node's params for a probe of shape `probe_shape`: sizes of the axes probed at size 1 become 1."""
    out = list(params)
    sizes = out[2] if node.op_type == "Resize" and len(out) > 2 else None
    if sizes is not None:
        axes = _attrs(node).get("axes") or list(range(len(shape)))
        s = sizes.copy()
        for k, ax in enumerate(axes):
            ax = _axis(ax, len(shape))
            if probe_shape[ax] != shape[ax]:
                s[k] = probe_shape[ax]
        out[2] = s
    return out


def _identity_axis(node, shape, params: list, k: int) -> bool:
    """Whether the params leave axis k alone by their values (scale 1, or its own size): probed at size 1."""
    axes = [_axis(ax, len(shape)) for ax in (_attrs(node).get("axes") or range(len(shape)))]
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
    "Pow": pow_,
    "Mod": mod,
    "IsInf": is_inf,
    "Cosh": _hyperbolic(1.0),
    "Sinh": _hyperbolic(-1.0),
    "Equal": equal,
    "CumProd": cum_prod,
    "LpNormalization": lp_normalization,
    "BatchNormalization": batch_norm,
    "Det": det,
    "ReverseSequence": reverse_sequence,
    "SpaceToDepth": space_to_depth,
    "EyeLike": eye_like,
    "Dropout": dropout,
    "ConvTranspose": conv_transpose,
    "Col2Im": col2im,
    "MaxPool": max_pool,
    "Resize": resize,
    "Upsample": resize,
}
