"""BF16ConvKernel: run bf16 convolutions (after MixedPrecision, in NCHW16c) on Kiln's C micro-kernel
that uses AVX512-BF16's vdpbf16ps (kiln/schedules/kernels/bf16_conv.c), or on AMX-BF16 targets the
tile kernel (amx_bf16_conv.c: a pixel range's receptive fields gathered, then tdpbf16ps; ranges of two
tiles of pixels across output rows in parallel, channels split too where the map is small (amx_tasks), weights
packed as AMX's B operand [O/16, K'/2, 16, 2]): TVM 0.27 cannot emit that
instruction (its LLVM code generator has no bfloat vector type and its TIR pipeline computes bf16 in
fp32). Each conv2d becomes a call_tir to a PrimFunc that calls the kernel per output row, in parallel
on TVM's thread pool over pairs of output-channel blocks (or over rows, where channels are few);
weights are packed here, at compile time, into the kernel's [O/16, I/16, KH, KW, 8, 16, 2] layout.
It writes float32; FuseBF16Epilogue then moves the bias, residual, ReLU/ReLU6 and bf16 cast that
follow into the kernel (Epilogue).
`stats["bf16_kernel_convs"]` counts the convs it took."""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
import tvm.script
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from .. import parallel_tasks
from ..ir import register_kernel
from .module_map import rewrite_calls

CHANNEL_TASKS = (
    16  # output-channel pairs that make enough tasks to parallelize over (else rows, unless there are fewer rows)
)
AMX_TASKS = 8  # at least this many AMX tasks (pixel ranges x channel ranges) where the channels allow
F32_TILE = 14  # pixels per tile of the fp32 kernel (f32_conv.c: TILE)
WEIGHT_BOUND = 4  # output channels per output pixel past which an AMX conv's tasks split only its channels
# names of the PrimFuncs that call a conv C kernel (their library must link it), by data type; each counts as a
# direct conv in the report (op histogram, conv layouts)
EXTERNS = {
    "bfloat16": register_kernel("kiln_bf16_conv", "nn.conv2d", convs=1),
    "float32": register_kernel("kiln_f32_conv", "nn.conv2d", convs=1),
}
# the C function and source (schedules/kernels.SOURCES) of each kernel, by (data type, AMX); a PrimFunc's attributes
# say which it calls (kernel_source)
C_KERNELS = {
    ("bfloat16", False): ("kiln_bf16_conv2d_nchw16c", "bf16_conv"),
    ("bfloat16", True): ("kiln_amx_bf16_conv2d_nchw16c", "amx_bf16_conv"),
    ("float32", False): ("kiln_f32_conv2d_nchw16c", "f32_conv"),  # F32ConvKernel (f32_conv_kernel.py)
}
KINDS = {"bfloat16": "bf16_conv", "float32": "f32_conv"}  # the PrimFunc's kiln.kernel_kind, which says its type


GEOMETRY = "kiln.conv_geometry"  # the PrimFunc attribute holding a conv kernel's ConvGeometry (as a list)


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """What a conv C kernel call was built for, kept on its PrimFunc (GEOMETRY) so the passes after
    (FuseBF16Epilogue rebuilds the call with its epilogue), export (which source to link) and the report
    (AMX or not) read it back by name."""

    strides: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right
    kernel: tuple[int, int]
    amx: bool
    dilation: tuple[int, int]

    def to_list(self) -> list[int]:
        return [*self.strides, *self.pads, *self.kernel, int(self.amx), *self.dilation]

    @classmethod
    def of(cls, attrs) -> ConvGeometry | None:
        """The geometry of a PrimFunc's attributes, None where it calls no conv kernel."""
        if attrs is None or GEOMETRY not in attrs:
            return None
        sh, sw, pt, pl, pb, pr, kh, kw, amx, dh, dw = (int(v) for v in attrs[GEOMETRY])
        return cls((sh, sw), (pt, pl, pb, pr), (kh, kw), bool(amx), (dh, dw))


def conv_dtype(attrs) -> str:
    """The data type of the conv kernel a PrimFunc (with a ConvGeometry) calls, from its kernel kind."""
    return next(t for t, kind in KINDS.items() if kind == str(attrs["kiln.kernel_kind"]))


def kernel_source(attrs) -> str:
    """The schedules/kernels.SOURCES name of the C kernel a PrimFunc with a ConvGeometry calls."""
    return C_KERNELS[conv_dtype(attrs), ConvGeometry.of(attrs).amx][1]


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What the C kernel does to each output tile as it stores it (kiln_bf16_conv2d_nchw16c's flags):
    + bias, + residual, GELU ("gelu_erf"/"gelu_tanh"), clamp to [lo, hi] (ReLU: [0, inf], ReLU6: [0, 6]), in that
    order; written in float32 and/or bf16. residual_bf16: the residual is read in bf16 (BF16Residuals' rounded
    residual stream)."""

    bias: bool = False
    residual: bool = False
    clamp: tuple[float, float] | None = None
    float32: bool = True
    bf16: bool = False
    residual_bf16: bool = False
    gelu: str | None = None

    @property
    def flags(self) -> int:  # bf16_epilogue.h: EP_BIAS, EP_RES, EP_CLAMP, EP_F32, EP_BF16, EP_RES16, EP_GELU_*
        res16 = self.residual and self.residual_bf16
        gelu = {None: 0, "gelu_erf": 64, "gelu_tanh": 128}[self.gelu]
        return (
            (self.bias | self.residual << 1 | (self.clamp is not None) << 2 | self.float32 << 3 | self.bf16 << 4)
            | res16 << 5
            | gelu
        )


def kernel_func(
    data_shape,
    out_blocks,
    kernel_hw,
    strides,
    padding,
    epilogue: Epilogue = Epilogue(),
    amx=False,
    dtype="bfloat16",
    dilation=(1, 1),
):
    """(PrimFunc calling the C kernel once per output row and task, output shape): tasks are pairs of output-
    channel blocks where there are enough of them, else rows. Its parameters: data, packed
    weights, then the epilogue's bias [1, O/16, 1, 1, 16] and residual (the output's shape, float32 or bf16) where
    it has them, then its outputs (float32, bf16). The conv's ConvGeometry is kept in the GEOMETRY
    attribute so FuseBF16Epilogue can rebuild the function with an epilogue. amx: the AMX-BF16 kernel,
    whose tasks are pixel ranges (amx_tasks: each gather serves the task's channels), and whose weights are
    packed for it. dtype: the data's and weights' type, "float32" for F32ConvKernel's AVX-512 kernel (f32_conv.c:
    the same call and tasks, and the dilation, which only it takes, as its last two arguments)."""
    _, ib, h, w, _ = data_shape
    ob, (kh, kw) = out_blocks, kernel_hw
    (sh, sw), (pt, pl, pb, pr) = strides, padding
    dh, dw = dilation
    oh, ow = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1, (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out_shape = (1, ob, oh, ow, 16)
    ch, cw, coh, cow = h, w, oh, ow  # the map as the C kernel walks it
    if dtype == "float32" and (kh, kw, sh, sw) == (1, 1, 1, 1) and not any(padding) and ow < F32_TILE:
        # a pointwise conv on a map narrower than a tile: one row of H*W pixels (NCHW16c keeps each block's map
        # contiguous), so its tiles are full (a 7x7 map: 14 pixels a tile, not 7)
        ch, cw, coh, cow = 1, h * w, 1, oh * ow
    packed = packed_shape(ob, ib, kh, kw, amx) if dtype == "bfloat16" else (ob, ib, kh, kw, 16, 16)
    params = [("data", tuple(data_shape), dtype), ("packed", tuple(packed), dtype)]
    params += [("bias", (1, ob, 1, 1, 16), "float32")] * epilogue.bias + [
        ("res", out_shape, "bfloat16" if epilogue.residual_bf16 else "float32")
    ] * epilogue.residual
    params += [("out", out_shape, "float32")] * epilogue.float32 + [("out16", out_shape, "bfloat16")] * epilogue.bf16
    names = {n for n, _, _ in params}
    ptr = [
        f"{n}.data" if n in names else "data.data" for n in ("bias", "res", "out", "out16")
    ]  # absent: never read (flags)
    geometry = ConvGeometry((sh, sw), (pt, pl, pb, pr), (kh, kw), amx, (dh, dw)).to_list()
    lo, hi = (float(v) for v in epilogue.clamp or (0.0, 0.0))
    bounds = f"T.float32({lo!r}), T.float32({hi!r})".replace(
        "inf", "'inf'"
    )  # TVMScript spells infinity T.float32('inf')
    pairs = -(-ob // 2)
    if amx:
        (loops, body), args = amx_tasks(oh * ow, ob)
    elif pairs >= min(
        CHANNEL_TASKS, coh
    ):  # tasks: pairs of output-channel blocks, each over every row: each weight is read once
        # (rows in parallel re-read the weights for every row: slower with cold weights; benchmarks/history.md)
        head, inner = parallel_tasks.loop(pairs, "c")
        loops, body = f"{head}{inner}for r in range({coh}):\n", inner + "    "
        ob_range = f"c * 2, T.min(c * 2 + 2, {ob})"
    else:  # tasks: output rows, each over every output channel (few channels: not enough pairs to keep the cores busy)
        loops, body = serial_c(coh)
        ob_range = f"0, {ob}"
    if not amx:
        args = f"{ob_range}, r" + (f", {dh}, {dw}" if dtype == "float32" else "")
    src = f"""
@T.prim_func
def func({", ".join(f'{n}: T.Buffer({s}, "{d}")' for n, s, d in params)}):
    T.func_attr({{"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8,
                 "kiln.kernel_kind": "{KINDS[dtype]}", "{GEOMETRY}": {geometry},
                 "kiln.bf16_epilogue": {epilogue.flags},
                 "kiln.flops": {2 * oh * ow * ob * 16 * kh * kw * ib * 16}}})
{loops}{body}T.evaluate(T.call_extern("int32", "{C_KERNELS[dtype, amx][0]}", data.data, packed.data, {", ".join(ptr)},
                                     {epilogue.flags}, {bounds},
                                     {ib}, {ch}, {cw}, {coh}, {cow}, {kh}, {kw}, {sh}, {sw}, {pt}, {pl}, {args}))
"""  # 8: opaque, FuseOps leaves it alone
    return tvm.script.from_source(src), out_shape


def amx_pixel_rows(pixels: int) -> int:
    """Pixels per AMX tile (at most 16): the map in the fewest tiles, spread evenly over them (49 -> 4 x 13)."""
    return -(-pixels // -(-pixels // 16))


def serial_c(tasks: int) -> tuple[str, str]:
    """(the loops, the body's indent) of tasks over one parallel index r (c = 0), shared evenly by the thread pool."""
    head, body = parallel_tasks.loop(tasks, "r", "        ")
    return f"    for c in range(1):\n{head}", body


def amx_tasks(pixels: int, ob: int) -> tuple[tuple[str, str], str]:
    """((the loops, their body's indent), the kernel's last arguments) of the AMX kernel's tasks: ranges of two
    pixel tiles (the 2 x 2 blocks' rows) over the whole map, row-major across output rows, each over a range of
    output-channel blocks; channels are split (into ranges of whole block pairs) where there are fewer than
    AMX_TASKS pixel ranges, so a 7 x 7 map's 4 tiles still make 8 tasks for the cores."""
    rows = amx_pixel_rows(pixels)
    span = 2 * rows
    if ob * 16 >= WEIGHT_BOUND * pixels:  # weights past the gathered pixels: every task over the whole map
        span = -(-pixels // rows) * rows
    ptasks = -(-pixels // span)
    pairs = -(-ob // 2)
    ctasks = max(1, min(pairs, -(-AMX_TASKS // ptasks)))
    per = 2 * -(-pairs // ctasks)
    ctasks = -(-ob // per)
    loops = serial_c(ptasks * ctasks)
    # channel range outer: the thread pool runs contiguous ranges of tasks, so each thread streams its own channels'
    # weights (once, then from L2), not every channel range's in turn
    args = f"r // {ptasks} * {per}, T.min(r // {ptasks} * {per} + {per}, {ob}), r % {ptasks} * {span}, {span}, {rows}"
    return loops, args


def packed_shape(ob: int, ib: int, kh: int, kw: int, amx: bool) -> tuple:
    """vdpbf16ps: [O/16, I/16, KH, KW, 8, 16, 2]; AMX: [O/16, K'/2, 16, 2], K' = KH*KW*I rounded up to 32."""
    return (ob, -(-kh * kw * ib * 16 // 32) * 16, 16, 2) if amx else (ob, ib, kh, kw, 8, 16, 2)


def pack(w: np.ndarray, amx: bool) -> np.ndarray:
    """[O/16, I/16, KH, KW, 16 i, 16 o] -> the kernel's layout (packed_shape); AMX's input order is
    (kh, input block, kw, channel), as the kernel gathers a pixel's receptive field (one row's KW taps of one
    block are contiguous in NCHW16c), zero past K."""
    ob, ib, kh, kw = w.shape[:4]
    if not amx:
        return np.ascontiguousarray(w.reshape(ob, ib, kh, kw, 8, 2, 16).transpose(0, 1, 2, 3, 4, 6, 5))
    shape = packed_shape(ob, ib, kh, kw, True)
    k = np.zeros((ob, shape[1] * 2, 16), w.dtype)
    k[:, : kh * kw * ib * 16] = w.transpose(0, 2, 1, 3, 4, 5).reshape(ob, -1, 16)
    return np.ascontiguousarray(k.reshape(ob, shape[1], 2, 16).transpose(0, 1, 3, 2))


def applies(call) -> bool:
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.nn.conv2d":
        return False
    a, x, w = call.attrs, call.args[0].ty, call.args[1]
    if (
        str(x.dtype) != "bfloat16"
        or not isinstance(w, GenericConst)
        or str(w.ty.dtype) != "bfloat16"
        or int(a.groups) != 1
    ):
        return False
    shp, wshp = [int(v) for v in x.shape.values], list(w.value.shape)
    return (
        len(shp) == 5
        and shp[0] == 1
        and shp[4] == 16
        and len(wshp) == 6
        and wshp[4] == 16
        and wshp[5] == 16
        and str(a.data_layout) == "NCHW16c"
        and all(int(d) == 1 for d in a.dilation)
        and str(a.out_dtype) == "float32"
    )


def _to_kernel(builder, call, amx: bool):
    if not applies(call):
        return None
    import ml_dtypes

    a = call.attrs
    w = call.args[1].value.numpy()  # [O/16, I/16, KH, KW, 16 i, 16 o]
    packed = pack(w, amx).astype(ml_dtypes.bfloat16)
    func, out_shape = kernel_func(
        tuple(int(v) for v in call.args[0].ty.shape.values),
        w.shape[0],
        w.shape[2:4],
        [int(s) for s in a.strides],
        [int(p) for p in a.padding],
        amx=amx,
    )
    gv = builder.add_func(func.without_attr("global_symbol"), EXTERNS["bfloat16"])  # TVMScript names it "func"
    return relax.call_tir(
        gv, [call.args[0], relax.const(packed, "bfloat16")], relax.TensorType(list(out_shape), "float32")
    )


# what BF16ConvKernel counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("bf16_kernel_convs", int, "bf16 convs on Kiln's vdpbf16ps/AMX conv kernel", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="BF16ConvKernel")
class BF16ConvKernel:
    """amx: the target has AMX-BF16 (caps.bf16 is BF16.AMX): the tile kernel instead of vdpbf16ps."""

    COUNTERS = COUNTERS

    def __init__(self, amx: bool = False):
        self.amx = amx
        self.stats = {"bf16_kernel_convs": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = rewrite_calls(mod, lambda b, call: _to_kernel(b, call, self.amx))
        if not count:
            return mod
        from ...schedules.kernels import build

        build(C_KERNELS["bfloat16", self.amx][1])  # compiled and loaded before anything references its symbol
        self.stats["bf16_kernel_convs"] += count
        return relax.transform.DeadCodeElimination(["main"])(out)
