"""Standard-domain math, normalization and layout ops whose TVM 0.27 converter is missing or wrong,
written out in ops TVM converts correctly (exact ONNX semantics: onnx/reference/ops/op_*.py).

Missing in TVM: CumProd, LpNormalization, Col2Im, Det, ReverseSequence. Wrong or incomplete in TVM:
Pow with mixed or integer operands (TVM's power is float-only, same-dtype), Mod with fmod=0 on floats
(infinite divisors), IsInf's detect_positive/detect_negative, Cosh/Sinh (no TIR intrinsic at build),
EyeLike's dtype attribute, Dropout's mask output, SpaceToDepth's CRD mode, BatchNormalization in
training mode. Equal on strings is refused. ConvTranspose, Col2Im, MaxPool and Resize: standard_spatial.py.

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


def attrs_of(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def model_of() -> onnx.ModelProto | None:
    """The model decompose() is rewriting (the rewrite interface passes shapes, not element types)."""
    return CURRENT_MODEL.get()


def dtype_of(name: str, consts: dict) -> int | None:
    """ONNX element type of value `name` (None when unknown)."""
    if name in consts:
        return helper.np_dtype_to_tensor_dtype(np.asarray(consts[name]).dtype)
    model = model_of()
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


def opset_of() -> int:
    m = model_of()
    return 1 if m is None else next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 1)


def reduce_of(em: Emitter, op: str, x: str, axes: list[int], keepdims: int) -> str:
    """A Reduce* over `axes` as the model's opset spells it (axes an input from opset 18, 13 for ReduceSum)."""
    if opset_of() >= (13 if op == "ReduceSum" else 18):
        return em.op(op, [x, em.const(np.array(axes, np.int64), "axes")], keepdims=keepdims)
    return em.op(op, [x], axes=list(axes), keepdims=keepdims)


def np_of(t: int):
    return helper.tensor_dtype_to_np_dtype(t)


def axis_of(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def const_int_of(name: str, consts: dict):
    return None if name not in consts else np.asarray(consts[name]).astype(np.int64)


# ------------------------------------------------------------------------------------------ elementwise


def pow_(node, em: Emitter, shapes, consts, where):
    """TVM's power takes two operands of one float dtype: cast the exponent to the base's float type, and
    compute an integer base in float64 (exact for the integers a pow of int64 can hold), rounded back."""
    tx, ty = dtype_of(node.input[0], consts), dtype_of(node.input[1], consts)
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
    t = dtype_of(node.input[0], consts)
    if attrs_of(node).get("fmod", 0) or t not in FLOATS:
        return False
    x, y = node.input
    m = em.op("Mod", [x, y], fmod=1)
    zero = em.const(np.zeros((), np_of(t)), "zero")
    fix = em.op(
        "And",
        [em.op("Not", [em.op("Equal", [m, zero])]), em.op("Xor", [em.op("Less", [y, zero]), em.op("Less", [m, zero])])],
    )
    em.op("Where", [fix, em.op("Add", [m, y]), m], out=node.output[0])
    return True


def is_inf(node, em: Emitter, shapes, consts, where):
    """detect_positive / detect_negative honoured (TVM's converter ignores them)."""
    a = attrs_of(node)
    pos, neg = a.get("detect_positive", 1), a.get("detect_negative", 1)
    if pos and neg:
        return False
    t = dtype_of(node.input[0], consts)
    if t is None:
        return False
    x = node.input[0]
    if not pos and not neg:  # nothing to detect: all false (shape-preserving, NaN-safe)
        em.op("And", [em.op("IsInf", [x]), em.const(np.zeros((), bool), "false")], out=node.output[0])
        return True
    em.op("Equal", [x, em.const(np.array(np.inf if pos else -np.inf, np_of(t)), "inf")], out=node.output[0])
    return True


def _hyperbolic(sign: float):
    def rewrite(node, em: Emitter, shapes, consts, where):
        """(exp(x) +- exp(-x)) / 2: TVM's cosh/sinh have no TIR intrinsic to build."""
        t = dtype_of(node.input[0], consts)
        if t is None:
            return False
        x = node.input[0]
        e, en = em.op("Exp", [x]), em.op("Exp", [em.op("Neg", [x])])
        s = em.op("Add" if sign > 0 else "Sub", [e, en])
        em.op("Mul", [s, em.const(np.array(0.5, np_of(t)), "half")], out=node.output[0])
        return True

    return rewrite


def equal(node, em: Emitter, shapes, consts, where):
    if dtype_of(node.input[0], consts) == TensorProto.STRING:
        raise UnsupportedModelError(
            "Equal on string tensors is not supported (no string type in TVM)",
            where=where,
            fix="compare the strings before the model, or encode them as ids",
        )
    return False


# ------------------------------------------------------------------------------------------ scans, norms


def cum_prod(node, em: Emitter, shapes, consts, where):
    """y[i] = prod of x[j] over j <= i (exclusive: j < i; reverse: j >= i): x broadcast against a constant
    lower-triangular mask along the axis, the masked-out factors set to 1, then ReduceProd. An axis fed at
    run time (the rank is static): the product along every axis, the one the axis names picked by Where."""
    shape, axis_v = shapes.get(node.input[0]), const_int_of(node.input[1], consts)
    t = dtype_of(node.input[0], consts)
    if shape is None or t is None:
        return False
    a = attrs_of(node)
    rank, flags = len(shape), (a.get("reverse", 0), a.get("exclusive", 0))
    if axis_v is not None:
        along = _cum_prod_along(em, node.input[0], shape, t, axis_of(int(axis_v.reshape(-1)[0]), rank), *flags, where)
        em.op("Identity", [along], out=node.output[0])
        return True
    ax = node.input[1]
    r = em.const(np.array(rank, np.int64), "rank")
    ax = em.op("Cast", [ax], to=TensorProto.INT64)
    ax = em.op("Where", [em.op("Less", [ax, em.const(np.array(0, np.int64), "zero")]), em.op("Add", [ax, r]), ax])
    out = _cum_prod_along(em, node.input[0], shape, t, rank - 1, *flags, where)
    for d in range(rank - 2, -1, -1):
        pick = em.op("Equal", [ax, em.const(np.array(d, np.int64), "d")])
        out = em.op("Where", [pick, _cum_prod_along(em, node.input[0], shape, t, d, *flags, where), out])
    em.op("Identity", [out], out=node.output[0])
    return True


def _cum_prod_along(em: Emitter, x: str, shape, t: int, axis: int, rev: int, exc: int, where: str) -> str:
    rank, n = len(shape), shape[axis]
    if n * int(np.prod(shape, dtype=np.int64)) > MAX_CONST * 4:
        raise UnsupportedModelError(
            f"CumProd over an axis of {n} is too large to unroll", where=where, fix="use a shorter axis"
        )
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    mask = (j > i if exc else j >= i) if rev else (j < i if exc else j <= i)
    # x: [..., n(axis), ...] -> [..., 1, n, ...] so that mask [n(i), n(j)] lines up on (axis, axis + 1)
    xu = em.op("Unsqueeze", [x, em.const(np.array([axis], np.int64), "ax")])
    m = mask.reshape((n, n) + (1,) * (rank - axis - 1))
    sel = em.op("Where", [em.const(m, "mask"), xu, em.const(np.ones((), np_of(t)), "one")])
    return reduce_of(em, "ReduceProd", sel, [axis + 1], 0)


def lp_normalization(node, em: Emitter, shapes, consts, where):
    """x / ||x||_p along axis (p 1 or 2), as onnx's reference computes it."""
    a = attrs_of(node)
    p, axis = a.get("p", 2), a.get("axis", -1)
    if p not in (1, 2):
        raise UnsupportedModelError(
            f"LpNormalization with p={p} (ONNX allows 1 or 2)", where=where, fix="use p=1 or p=2"
        )
    t = dtype_of(node.input[0], consts)
    if t is None:
        return False
    norm = reduce_of(em, "ReduceL1" if p == 1 else "ReduceL2", node.input[0], [axis], 1)
    zero = em.const(np.zeros((), np_of(t)), "zero")
    em.op("Where", [em.op("Equal", [norm, zero]), zero, em.op("Div", [node.input[0], norm])], out=node.output[0])
    return True


def batch_norm(node, em: Emitter, shapes, consts, where):
    """training_mode=1: normalise with the batch's own mean and (biased) variance; the running statistics
    come out as input_mean * momentum + batch_mean * (1 - momentum) (same for var)."""
    a = attrs_of(node)
    if not a.get("training_mode", 0):
        return False
    shape, t = shapes.get(node.input[0]), dtype_of(node.input[0], consts)
    if shape is None or t is None:
        return False
    x, scale, bias, mean, var = node.input[:5]
    eps, mom, rank, dt = a.get("epsilon", 1e-5), a.get("momentum", 0.9), len(shape), np_of(t)
    axes = [0] + list(range(2, rank))
    cshape = em.const(np.array([1, -1] + [1] * (rank - 2), np.int64), "cshape")
    bmean = reduce_of(em, "ReduceMean", x, axes, 1)
    d = em.op("Sub", [x, bmean])
    bvar = reduce_of(em, "ReduceMean", em.op("Mul", [d, d]), axes, 1)
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
    a = attrs_of(node)
    rank = len(shape)
    ta, ba = axis_of(a.get("time_axis", 0), rank), axis_of(a.get("batch_axis", 1), rank)
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
    a = attrs_of(node)
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
    a = attrs_of(node)
    t = a.get("dtype") or dtype_of(node.input[0], consts)
    if t is None:
        return False
    val = np.eye(shape[0], shape[1], k=a.get("k", 0)).astype(np_of(t))
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
}
