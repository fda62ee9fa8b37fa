"""ONNX BitCast (opset 26: reinterpret a tensor's bits as another type of the same width), which TVM 0.27's
importer lacks, in standard ops: ONNX has no other bit-reinterpreting op, so the IEEE-754 fields are
computed exactly with integer and power-of-two arithmetic.

integer -> integer of the same width: Cast (two's-complement wrap keeps the bits). integer -> float:
the sign, then the other bits u (in int64, masked), biased exponent E = u // 2^M, mantissa
m = u mod 2^M; value = (E > 0 + m 2^-M) 2^(max(E,1) - bias), inf/NaN at E = 2^e - 1. float -> integer:
E from floor(log2 |x|), corrected by one either way against an exact table of powers of two, then m
= (|x| / 2^(E-bias) - 1) 2^M (|x| 2^(bias-1+M) for subnormals), both exact; NaN gives the quiet NaN.
float16/bfloat16 are computed in float32, float64 in float64, all exactly."""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedModelError
from .emitter import Emitter
from .llm_common import elem_type
from .quant import node_attrs

I64 = np.int64
# ONNX element type -> (width in bits, (exponent bits, mantissa bits) for floats, work float type)
FLOATS = {1: (32, 8, 23, 1), 10: (16, 5, 10, 1), 16: (16, 8, 7, 1), 11: (64, 11, 52, 11)}
INTS = {2: 8, 3: 8, 9: 8, 4: 16, 5: 16, 6: 32, 12: 32, 7: 64, 13: 64}
SIGNED = {8: 3, 16: 5, 32: 6, 64: 7}  # width -> signed integer type of that width
NP_FLOAT = {1: np.float32, 11: np.float64}


def _width(t):
    return FLOATS[t][0] if t in FLOATS else INTS.get(t)


def _unsigned_bits(em: Emitter, x: str, w: int) -> tuple[str, str]:
    """(sign bit as bool, the other W-1 bits as a non-negative int64) of an integer tensor of width w."""
    s = em.op("Cast", [x], to=SIGNED[w])  # same width: the bits kept
    s = em.op("Cast", [s], to=7) if w < 64 else s
    neg = em.op("Less", [s, em.const(I64(0), "zero")])
    # the low W-1 bits: a mask, as a signed add that wraps would overflow (TVM's codegen takes that as UB)
    return neg, em.op("BitwiseAnd", [s, em.const(I64((1 << (w - 1)) - 1), "mask")])


def _to_float(em: Emitter, x: str, w: int, fmt, to: int, out: str):
    _, eb, mb, work = fmt
    ft, bias, emax = NP_FLOAT[work], (1 << (eb - 1)) - 1, (1 << eb) - 1
    c = lambda v, h="c": em.const(np.asarray(v, ft), h)
    neg, low = _unsigned_bits(em, x, w)
    e = em.op("Div", [low, em.const(I64(1 << mb), "p2m")])
    m = em.op("Sub", [low, em.op("Mul", [e, em.const(I64(1 << mb), "p2m")])])
    scale = np.array([2.0 ** (max(k, 1) - bias) for k in range(emax)] + [np.inf], np.float64).astype(ft)
    frac = em.op("Mul", [em.op("Cast", [m], to=work), c(2.0**-mb, "ulp")])
    frac = em.op("Add", [frac, em.op("Cast", [em.op("Greater", [e, em.const(I64(0), "zero")])], to=work)])
    val = em.op("Mul", [frac, em.op("Gather", [em.const(scale, "pow2"), e], axis=0)])
    nan = em.op(
        "And", [em.op("Equal", [e, em.const(I64(emax), "emax")]), em.op("Greater", [m, em.const(I64(0), "zero")])]
    )
    val = em.op("Where", [nan, c(np.nan, "nan"), val])
    val = em.op("Where", [neg, em.op("Mul", [val, c(-1.0, "minus")]), val])
    em.op("Cast", [val], out=out, to=to)


def _to_int(em: Emitter, x: str, fmt, to: int, out: str):
    w, eb, mb, work = fmt
    ft, bias, emax = NP_FLOAT[work], (1 << (eb - 1)) - 1, (1 << eb) - 1
    c = lambda v, h="c": em.const(np.asarray(v, ft), h)
    ci = lambda v, h="i": em.const(I64(v), h)
    xf = em.op("Cast", [x], to=work)
    a = em.op("Abs", [xf])
    zero = c(0.0, "zero")
    neg = em.op(
        "Or",
        [
            em.op("Less", [xf, zero]),  # -0.0: its reciprocal is -inf
            em.op("Less", [em.op("Div", [c(1.0, "one"), xf]), zero]),
        ],
    )
    # lower bound of each biased exponent's range: 0 (subnormals), 2^(E-bias), inf (inf and NaN)
    lo = em.const(np.array([0.0] + [2.0 ** (k - bias) for k in range(1, emax)] + [np.inf]).astype(ft), "pow2")
    est = em.op(
        "Add",
        [em.op("Floor", [em.op("Mul", [em.op("Log", [a]), c(1 / np.log(2), "inv_ln2")])]), c(float(bias), "bias")],
    )
    est = em.op("Min", [em.op("Max", [est, zero]), c(float(emax), "emax")])
    e = em.op("Cast", [est], to=7)
    down = em.op("And", [em.op("Greater", [e, ci(0, "zero")]), em.op("Less", [a, em.op("Gather", [lo, e], axis=0)])])
    e = em.op("Sub", [e, em.op("Cast", [down], to=7)])
    nxt = em.op("Gather", [lo, em.op("Min", [em.op("Add", [e, ci(1, "one")]), ci(emax, "emax")])], axis=0)
    up = em.op("And", [em.op("Less", [e, ci(emax, "emax")]), em.op("GreaterOrEqual", [a, nxt])])
    isnan = em.op("IsNaN", [xf])
    e = em.op("Where", [isnan, ci(emax, "emax"), em.op("Add", [e, em.op("Cast", [up], to=7)])])
    normal = em.op(
        "Mul", [em.op("Sub", [em.op("Div", [a, em.op("Gather", [lo, e], axis=0)]), c(1.0, "one")]), c(2.0**mb, "p2m")]
    )
    sub = em.op("Mul", [em.op("Mul", [a, c(2.0 ** (bias - 1), "p2b")]), c(2.0**mb, "p2m")])
    mf = em.op("Where", [em.op("Equal", [e, ci(0, "zero")]), sub, normal])
    mf = em.op("Where", [em.op("Equal", [e, ci(emax, "emax")]), zero, mf])
    mf = em.op("Where", [isnan, c(2.0 ** (mb - 1), "qnan"), mf])
    neg = em.op("And", [neg, em.op("Not", [isnan])])
    bits = em.op("Add", [em.op("Mul", [e, ci(1 << mb, "p2m")]), em.op("Cast", [mf], to=7)])
    bits = em.op("Where", [neg, em.op("BitwiseOr", [bits, ci(-(1 << (w - 1)), "sign")]), bits])
    em.op("Cast", [em.op("Cast", [bits], to=SIGNED[w])], out=out, to=to)  # same width: the bits kept


def bitcast(node, em: Emitter, shapes, consts, where):
    src, to = elem_type(node.input[0]), node_attrs(node).get("to")
    ws, wt = _width(src), _width(to)
    if ws is None or wt is None or ws != wt:
        raise UnsupportedModelError(
            f"BitCast from element type {src} to {to} is not supported",
            where=f"{where}: node {node.name!r}",
            fix="BitCast between integer, float16/bfloat16/float/double types of one width",
        )
    x, out = node.input[0], node.output[0]
    if src in INTS and to in INTS:
        em.op("Cast", [x], out=out, to=to)
    elif src in INTS:
        _to_float(em, x, ws, FLOATS[to], to, out)
    elif to in INTS:
        _to_int(em, x, FLOATS[src], to, out)
    else:  # float16 <-> bfloat16
        tmp = em.name("bits")
        _to_int(em, x, FLOATS[src], 5, tmp)
        _to_float(em, tmp, 16, FLOATS[to], to, out)
