"""Kiln's legalizations that TVM's defaults lack: uint8 x int8 conv2d in NCHW{c}c and matmul to the
int8 computes of the target's int8 kernel (legalize_int8, via legalize_map(caps)); conv2d in a
blocked NCHW{n}c layout lowers to topi's conv2d_NCHWc (TVM's default legalization skips blocked
layouts and the build fails), and depthwise and grouped conv2d in NCHW{n}c (PropagateBlockedLayout and
BlockGroupedConv make them) to Kiln's own computes; ONNX NonMaxSuppression to a vectorized kernel
(legalize_nms), RoiAlign channels-last (legalize_roi_align). Elementwise ops whose TVM lowering does
not vectorize (exp, erf, tanh, sigmoid, SiLU: one libm call per element; round: te.nearbyint;
isfinite/isinf: fabs) get vectorizing computes, and a bool tensor's layout_transform goes through uint8.
Everything else falls through to TVM's registered legalizer."""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.ir.expr import GenericConst

from ..schedules.rules.int8 import Int8Kernel, int8_kernel
from ..schedules.rules.kinds import declare
from . import ir, legalize_int8, legalize_nms, legalize_roi_align
from .legalize_conv3d import conv3d

FLOATS = ("float32", "float16", "float64")


def tvm_legalize(bb, call):
    """TVM's own legalization of the call's op: what every Kiln legalization falls back to."""
    return tvm.ir.Op.get(call.op.name).get_attr("FLegalize")(bb, call)


def depthwise_conv2d_nchwc(data, kernel, strides, padding, dilation, out_dtype):
    """Depthwise conv2d, data [N, C/c, H, W, c], weight [C/c, 1, KH, KW, 1, c] (channel multiplier 1):
    TVM 0.27 has no compute for it. padding is [top, left, bottom, right]."""
    n, cb, h, w, c = data.shape
    _, _, kh, kw, _, _ = kernel.shape
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    padded = topi.nn.pad(data, [0, 0, pt, pl, 0], [0, 0, pb, pr, 0], name="depthwise_pad")
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    return te.compute(
        (n, cb, oh, ow, c),
        lambda b, o, y, x, i: te.sum(
            padded[b, o, y * sh + ry * dh, x * sw + rx * dw, i].astype(out_dtype)
            * kernel[o, 0, ry, rx, 0, i].astype(out_dtype),
            axis=[ry, rx],
        ),
        name="depthwise_conv2d_NCHWc",
        attrs=declare("conv2d"),
    )


def grouped_conv2d_nchwc(data, kernel, strides, padding, dilation, groups, out_dtype):
    """Grouped conv2d, data [N, C/b, H, W, b], weight [O/b, I/groups/b, KH, KW, b, b] (passes/block_grouped_conv):
    output block o reads only the input blocks of its group. Written as topi's conv2d_NCHWc (its stage names
    and reduction order: input channel, then kh, kw) so the blocked conv rules schedule it."""
    n, _, h, w, _ = data.shape
    ob, ib_g, kh, kw, bi, _ = kernel.shape
    ob_g = ob // groups  # output blocks per group
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    padded = topi.nn.pad(data, [0, 0, pt, pl, 0], [0, 0, pb, pr, 0], name="data_pad") if any(padding) else data
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    ic = te.reduce_axis((0, ib_g * bi), name="ic")
    ry, rx = te.reduce_axis((0, kh), name="kh"), te.reduce_axis((0, kw), name="kw")
    return te.compute(
        (n, ob, oh, ow, kernel.shape[5]),
        lambda b, o, y, x, j: te.sum(
            padded[b, o // ob_g * ib_g + ic // bi, y * sh + ry * dh, x * sw + rx * dw, ic % bi].astype(out_dtype)
            * kernel[o, ic // bi, ry, rx, ic % bi, j].astype(out_dtype),
            axis=[ic, ry, rx],
        ),
        name="conv2d_NCHWc",
        attrs=declare("conv2d"),
    )


def _conv2d(bb, call, int8: Int8Kernel | None = None):
    a = call.attrs
    out_dtype = ir.out_dtype(a) or str(call.ty.dtype)
    blocked = a.data_layout not in ("NCHW", "NHWC")
    if blocked and (lowered := legalize_int8.conv2d(bb, call, int8)) is not None:
        return lowered
    # data, weights, strides, padding, dilation: what every blocked conv compute below takes first
    conv = (call.args[0], call.args[1], *([int(x) for x in v] for v in (a.strides, a.padding, a.dilation)))
    if blocked and int(a.groups) != 1 and str(a.kernel_layout).startswith("OIHW1i"):
        return bb.call_te(depthwise_conv2d_nchwc, *conv, out_dtype, primfunc_name_hint="depthwise_conv2d_NCHWc")
    if blocked and int(a.groups) != 1 and len(call.args[1].ty.shape) == 6:  # BlockGroupedConv's
        return bb.call_te(grouped_conv2d_nchwc, *conv, int(a.groups), out_dtype, primfunc_name_hint="conv2d_NCHWc")
    if not blocked or int(a.groups) != 1:
        return tvm_legalize(bb, call)
    return bb.call_te(
        topi.nn.conv2d_NCHWc, *conv, a.data_layout, a.out_layout, out_dtype, primfunc_name_hint="conv2d_NCHWc"
    )


def _matmul(bb, call, int8: Int8Kernel | None = None):
    x, w = call.args[0].ty, call.args[1].ty
    if (lowered := legalize_int8.matmul(bb, call, int8)) is not None:
        return lowered
    if str(x.dtype) == "float16" and str(w.dtype) == "float16" and str(call.ty.dtype) == "float16":
        # fp16 products summed in fp16 lose a bit per add (onnxruntime's CPU kernels, like ONNX's reference,
        # sum in float32): the same matmul in float32, cast back once
        from tvm import relax

        f32 = [relax.op.astype(a, "float32") for a in call.args[:2]]
        return relax.op.astype(relax.op.matmul(*f32, out_dtype="float32"), "float16")
    return tvm_legalize(bb, call)


def softmax_fast_exp(x, axis: int):
    """Softmax along `axis` with topi's fast_exp: max, exp(x - max), sum, divide."""
    axis = axis % len(x.shape)
    at = lambda idx: [0 if k == axis else v for k, v in enumerate(idx)]
    mx = topi.max(x, axis=axis, keepdims=True)
    e = topi.fast_exp(te.compute(x.shape, lambda *i: x(*i) - mx(*at(i)), name="softmax_shift"))
    total = topi.sum(e, axis=axis, keepdims=True)
    return te.compute(x.shape, lambda *i: e(*i) / total(*at(i)), name="softmax_norm", attrs=declare("softmax"))


def _fast_math(compute, attrs=lambda call: ()):
    """float32 exp/erf/tanh/softmax as polynomial/rational approximations that vectorize (topi's
    fast_* functions, accurate to a few ulp; TVM's defaults call libm once per element, which
    LLVM cannot vectorize: a GELU epilogue dominated its matmul's kernel; benchmarks/history.md). `attrs(call)`: the
    compute's arguments after the input."""

    def legalize(bb, call):
        if str(call.ty.dtype) != "float32":
            return tvm_legalize(bb, call)
        return bb.call_te(compute, call.args[0], *attrs(call), primfunc_name_hint=call.op.name.split(".")[-1])

    return legalize


PARTIAL_CHUNKS = 8  # contiguous chunks a large reduction to one value is split into: parallel partial results
PARALLEL_ELEMENTS = 1 << 15  # from this many elements (ViT-B's dynamic quantizer ranges: 151K-605K)


def _to_one_value(x, reducer, kind: str, keepdims: bool):
    """A static reduction of every element in two stages, or None: v partial results (v the widest
    power-of-two vector up to 16 dividing the last axis), each over every v-th element, then one over
    those; the first is a spatial + reduction block the reduction rule vectorizes. (TVM's rfactor would
    split it in the schedule, but it knows no reducer with an infinite identity.) A dynamic quantizer's
    min and max over a [32, 128] tensor ran one scalar op per element, 16 of them a third of gpt2_qdynamic's
    run. From PARALLEL_ELEMENTS the partial results are [PARTIAL_CHUNKS, v], one row per contiguous chunk,
    which the rule runs in parallel: ViT-B's int8 build spent 2.4 ms on one core in its 197 x 768 ranges
    (timings in benchmarks/history.md)."""
    if not all(isinstance(d, (int, tvm.tirx.IntImm)) for d in x.shape) or not x.shape:
        return None
    dims = [int(d) for d in x.shape]
    v = next((w for w in (16, 8, 4) if dims[-1] % w == 0), 0)
    total = math.prod(dims)
    if not v or total < 8 * v:
        return None
    chunks = PARTIAL_CHUNKS if total >= PARALLEL_ELEMENTS and total % (PARTIAL_CHUNKS * v) == 0 else 1

    def at(flat):
        idx, stride = [], total
        for d in dims:
            stride //= d
            idx.append(flat // stride % d)
        return x(*idx)

    per = total // (v * chunks)  # vectors of v a chunk holds
    o = te.reduce_axis((0, per), name="o")
    partial = te.compute(
        (chunks, v),
        lambda c, i: reducer(at((c * per + o) * v + i), axis=o),
        name=f"T_{kind}_partial",
        attrs=declare("reduction"),
    )
    c, i = te.reduce_axis((0, chunks), name="c"), te.reduce_axis((0, v), name="i")
    return te.compute(
        [1] * len(dims) if keepdims else [], lambda *_: reducer(partial[c, i], axis=[c, i]), name=f"T_{kind}"
    )


def _inf_identity_reduce(kind: str):
    """float max/min reductions whose identity is -inf/+inf, as ONNX's ReduceMax/ReduceMin are (topi's use
    the lowest/highest finite value, so the max of a row of -inf was -3.4e38 and the attention test
    'is the row fully masked: max == -inf' never fired, leaving NaN where ONNX gives 0)."""
    combine = tvm.tirx.max if kind == "max" else tvm.tirx.min
    ident = float("-inf") if kind == "max" else float("inf")
    reducer = te.comm_reducer(lambda a, b: combine(a, b), lambda t: tvm.tirx.const(ident, t), name=kind)

    def compute(x, axes, keepdims: bool):
        rank = len(x.shape)
        axes = sorted({a % rank for a in axes}) if axes is not None else list(range(rank))
        if len(axes) == rank and (whole := _to_one_value(x, reducer, kind, keepdims)) is not None:
            return whole
        rs = {a: te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes}
        out_shape = [1 if a in rs else d for a, d in enumerate(x.shape) if keepdims or a not in rs]

        def body(*idx):
            it = iter(idx)
            full = []
            for a in range(rank):
                if a in rs:
                    if keepdims:
                        next(it)
                    full.append(rs[a])
                else:
                    full.append(next(it))
            return reducer(x(*full), axis=list(rs.values()))

        return te.compute(out_shape, body, name=f"T_{kind}", attrs=declare("reduction"))

    def boolean(x, axes, keepdims: bool):  # any / all: topi has no identity for bool
        reduce = topi.max if kind == "max" else topi.min
        return topi.cast(reduce(topi.cast(x, "int8"), axis=axes, keepdims=keepdims), "bool")

    def legalize(bb, call):
        dtype = str(call.ty.dtype)
        if dtype not in ("float32", "float16", "float64", "bfloat16", "bool"):
            return tvm_legalize(bb, call)
        axes = [int(a) for a in call.attrs.axis] if call.attrs.axis is not None else None
        return bb.call_te(
            boolean if dtype == "bool" else compute,
            call.args[0],
            axes,
            bool(call.attrs.keepdims),
            primfunc_name_hint=kind,
        )

    return legalize


def _round(bb, call):
    """ONNX Round, and every quantize (Kiln's QuantizeGraph, QDQ models): relax legalizes it to topi.round,
    te.nearbyint, which TVM 0.27's vectorizer does not know (no TVectorizable): it leaves the vector loop
    scalar, LLVM then vectorizes the loop around it with gathers, and ResNet-50's int8 quantize kernels
    ran far below the memory's bandwidth. tirx.round lowers to the same llvm.nearbyint on CPUs (ties to
    even, as ONNX rounds) and vectorizes (timings in benchmarks/history.md)."""
    if str(call.ty.dtype) not in FLOATS:
        return tvm_legalize(bb, call)
    return bb.call_te(_te_round, call.args[0], primfunc_name_hint="round")


def _quantize(bb, call):
    """relax.quantize with a per-tensor constant scale (a QDQ model's, after LowerQDQ): x * (1 / s), not TVM's
    x / s, whose vdivps (a zmm every 10-16 cycles) bound ResNet-50's QDQ conv epilogues (benchmarks/history.md).
    The product may differ from the quotient in its last bit, which moves a value lying exactly on a rounding
    boundary by one step, as Kiln's own quantizer (it multiplies too). Other scales: TVM's legalization."""
    scale, z = ir.scalar_value(call.args[1]), ir.scalar_value(call.args[2])
    if scale is None or z is None or "int" not in str(call.attrs.out_dtype):  # float8 outputs are not rounded: TVM's
        return tvm_legalize(bb, call)
    inv, dtype = float(np.float32(1.0) / np.float32(scale)), str(call.attrs.out_dtype)
    lo, hi = tvm.tirx.min_value(dtype), tvm.tirx.max_value(dtype)

    def compute(x):
        def one(*i):
            r = te.round(x(*i) * tvm.tirx.const(inv, "float32")) + tvm.tirx.const(z, "float32")
            return te.max(te.min(r, hi.astype("float32")), lo.astype("float32")).astype(dtype)

        return te.compute(x.shape, one, name="quantized")

    return bb.call_te(compute, call.args[0], primfunc_name_hint="quantize")


def _finite_test(test: str):
    """isfinite / isinf of a float tensor as comparisons with +-inf: TVM lowers them to fabs and isnan,
    and its vectorizer leaves a loop holding fabs scalar (no TVectorizable). Every float-to-int Cast
    (where(!isfinite(x), 0, x)) scalarized its kernel with all the elementwise ops fused into it:
    ddddocr's dequantize + sigmoid epilogues ran slowly (benchmarks/history.md). NaN compares false both ways: not
    finite, not infinite, as the ONNX ops say."""

    def compute(x):
        inf = tvm.tirx.const(float("inf"), x.dtype)
        if test == "isfinite":
            return te.compute(x.shape, lambda *i: tvm.tirx.all(x(*i) < inf, x(*i) > -inf), name="T_isfinite")
        return te.compute(x.shape, lambda *i: tvm.tirx.any(x(*i) == inf, x(*i) == -inf), name="T_isinf")

    def legalize(bb, call):
        if str(call.args[0].ty.dtype) not in FLOATS:
            return tvm_legalize(bb, call)
        return bb.call_te(compute, call.args[0], primfunc_name_hint=test)

    return legalize


def _te_round(x):
    return te.compute(x.shape, lambda *i: te.round(x(*i)), name="T_round")


def sigmoid_fast_exp(x):
    """1 / (1 + exp(-x)) with topi.fast_exp: TVM's sigmoid lowers to llvm.exp, which LLVM turns into one
    libm call per element (EfficientNet's conv + SiLU kernels ran far below peak; timings in benchmarks/history.md).
    fast_exp clamps its argument, so a large |x| gives 0 or 1, never inf/inf."""
    e = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: tvm.tirx.const(1.0, x.dtype) / (tvm.tirx.const(1.0, x.dtype) + e(*i)))


def silu_fast_exp(x):
    s = sigmoid_fast_exp(x)
    return te.compute(x.shape, lambda *i: x(*i) * s(*i))


def gelu_fast_erf(x):
    """x * (0.5 + 0.5 erf(x / sqrt 2)), TVM's gelu with topi.fast_erf (ONNX Gelu, the dynamo exporter's)."""
    e = topi.fast_erf(topi.multiply(x, tvm.tirx.const(0.5**0.5, x.dtype)))
    half = tvm.tirx.const(0.5, x.dtype)
    return te.compute(x.shape, lambda *i: x(*i) * (half + e(*i) * half))


def gelu_tanh_fast(x):
    """0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) with topi.fast_tanh (Gelu approximate="tanh")."""
    c = lambda v: tvm.tirx.const(v, x.dtype)
    inner = te.compute(x.shape, lambda *i: c(math.sqrt(2 / math.pi)) * x(*i) * (1 + c(0.044715) * x(*i) * x(*i)))
    t = topi.fast_tanh(inner)
    return te.compute(x.shape, lambda *i: c(0.5) * x(*i) * (c(1.0) + t(*i)))


def _power(bb, call):
    """x ** k for a constant k in 2, 3, 4 as multiplies (GPT-2's GELU has Pow(x, 3)): TVM calls powf per
    element, which LLVM does not vectorize."""
    k = call.args[1]
    value = k.value.numpy() if isinstance(k, GenericConst) else None
    same_shape = str(call.ty.shape) == str(call.args[0].ty.shape)
    n = float(value.reshape(())) if value is not None and value.size == 1 else None
    if str(call.ty.dtype) != "float32" or not same_shape or n not in (2.0, 3.0, 4.0):
        return tvm_legalize(bb, call)
    return bb.call_te(lambda x: _repeated_product(x, int(n)), call.args[0], primfunc_name_hint="power")


def _repeated_product(x, n: int):
    def body(*i):
        out = x(*i)
        for _ in range(n - 1):
            out = out * x(*i)
        return out

    return te.compute(x.shape, body, name="T_power")


def _layout_transform(bb, call):
    """A bool tensor's layout_transform through uint8 (TVM's lowering pads with float 0.0 whatever the
    dtype, and its schedule refuses that for bool); any other dtype as TVM lowers it."""
    if str(call.args[0].ty.dtype) != "bool":
        return tvm_legalize(bb, call)
    wide = bb.emit_te(topi.cast, call.args[0], "uint8")
    a = call.attrs
    inner = bb.normalize(relax.op.layout_transform(wide, a.index_map, None if a.pad_value is None else 0))
    return bb.call_te(topi.cast, bb.emit(tvm_legalize(bb, inner)), "bool")


LEGALIZE = {
    "relax.layout_transform": _layout_transform,
    "relax.isfinite": _finite_test("isfinite"),
    "relax.isinf": _finite_test("isinf"),
    "relax.round": _round,
    "relax.quantize": _quantize,
    "relax.power": _power,
    "relax.nn.gelu": _fast_math(gelu_fast_erf),
    "relax.nn.gelu_tanh": _fast_math(gelu_tanh_fast),
    "relax.sigmoid": _fast_math(sigmoid_fast_exp),
    "relax.nn.silu": _fast_math(silu_fast_exp),
    "relax.max": _inf_identity_reduce("max"),
    "relax.min": _inf_identity_reduce("min"),
    "relax.nn.conv2d": _conv2d,
    "relax.matmul": _matmul,
    "relax.exp": _fast_math(topi.fast_exp),
    "relax.erf": _fast_math(topi.fast_erf),
    "relax.tanh": _fast_math(topi.fast_tanh),
    "relax.nn.softmax": _fast_math(softmax_fast_exp, lambda call: (int(call.attrs.axis),)),
}


def legalize_map(caps) -> dict:
    """LEGALIZE for a target: uint8 x int8 convs and matmuls take the int8 computes of the target's
    int8 kernel (schedules/rules/int8.py); without one they legalize as any other op."""
    kernel = int8_kernel(caps)
    conv = lambda bb, call: _conv2d(bb, call, kernel)
    mm = lambda bb, call: _matmul(bb, call, kernel)
    c3 = lambda bb, call: conv3d(bb, call, caps.f32_block, tvm_legalize)
    lanes = max(caps.vector_bits // 32, 4)
    nms = legalize_nms.legalize(lanes, tvm_legalize)
    return {
        **LEGALIZE,
        "relax.nn.conv2d": conv,
        "relax.matmul": mm,
        "relax.nn.conv3d": c3,
        "relax.vision.all_class_non_max_suppression": nms,
        "relax.vision.roi_align": legalize_roi_align.legalize(lanes, tvm_legalize),
    }
