"""BF16MatmulKernel: with --precision bf16 on a CPU with AVX512-BF16 or Arm BF16, a float32 matmul by constant
weights (a transformer's projections and MLP, a classifier) runs on Kiln's bf16 C kernel: vdpbf16ps on x86-64
(kiln/schedules/kernels/bf16_matmul.c), AMX tiles (tdpbf16ps, amx_bf16_matmul.c, the same arguments) where the
target has AMX-BF16, bfmmla on arm64 (bf16_matmul_arm.c, the same symbol and arguments). The
weights are converted to bf16 and packed at compile time for the target's kernel (`pack`), float32 accumulation,
the bias added as the tile is stored. The activations are cast to bf16 by an astype this pass inserts, which
FuseOps fuses into their producer (LayerNorm, GELU, the attention output's transpose), so the producer writes
bf16 once instead of every task converting its rows (an odd K, whose rows are not whole bf16 pairs, is converted
by the kernel). TVM 0.27 computes bf16 matmuls in float32 registers, so before this `--precision bf16` left
transformers' matmuls in float32 (bit-identical to the fp32 build). One vdpbf16ps does 32 multiply-adds where an
fp32 FMA does 16; one tdpbf16ps 8192; one bfmmla 16 where an fp32 fmla does 4. Each matmul becomes a call_tir
to a PrimFunc calling the kernel over its tasks (`tasks`) in parallel; timings in benchmarks/history.md.
`stats["bf16_kernel_matmuls"]` counts them."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import tvm
import tvm.script
from tvm import relax
from tvm.ir.expr import GenericConst

from ...counters import Counter
from ...schedules.kernels import C_KERNEL_ATTR
from ...schedules.rules.tiles import CACHE_BYTES
from .. import parallel_tasks
from ..ir import module_var_uses, op_name
from .counting import float32_shape
from .module_map import rewrite_calls

SOURCE, FUNCTION = "bf16_matmul", "kiln_bf16_matmul"
MIN_TASKS = 8  # fewer column tasks than this split the rows too (2 threads x 4 tasks each)
TILES = {6: 4, 8: 3, 32: 2}  # register tiles: rows -> blocks of 16 columns (24 zmm accumulators; AMX: 2 x 2 tiles)
AMX_ROWS = 32  # rows amx_bf16_matmul.c computes a step (two A tiles)
BLOCK = 16


def takes(call) -> bool:
    """A float32 matmul of static activations [..., M, K] by constant weights [K, N], N at least 16 (the kernel's
    columns come in blocks of 16: other N are padded with zero columns and the output sliced back, so a
    1000-class classifier reads bf16 weights too)."""
    if op_name(call) != "relax.matmul" or not isinstance(call.args[1], GenericConst):
        return False
    x, w = float32_shape(call.args[0]), list(call.args[1].value.shape)
    return (
        x is not None
        and len(w) == 2
        and str(call.args[1].value.dtype) == "float32"
        and len(x) >= 2
        and x[-1] == w[0]
        and w[1] >= BLOCK
    )


@dataclasses.dataclass(frozen=True)
class KernelType:
    """What differs between Kiln's bf16 matmul kernels and its fp16 one (fp16_matmul_arm.c, FP16MatmulKernel):
    one PrimFunc shape, one call signature and one rewrite serve both."""

    dtype: str  # x where it comes reduced, the packed weights and the 16-bit output
    source: str  # the C kernel (schedules/kernels' SOURCES name)
    function: str
    kind: str = ""  # the kernel kind (schedules/rules/kinds), where it is not the source's name

    @property
    def kernel_kind(self) -> str:
        return self.kind or self.source


BF16 = KernelType("bfloat16", SOURCE, FUNCTION)
FP16 = KernelType("float16", "fp16_matmul", "kiln_fp16_matmul")
F32 = KernelType("float32", "f32_matmul", "kiln_f32_matmul")  # AVX-512 fp32 FMAs (F32MatmulKernel): x stays float32
AMX = KernelType("bfloat16", "amx_bf16_matmul", "kiln_amx_bf16_matmul", "bf16_matmul")  # AMX-BF16 tiles
BY_SOURCE = {t.source: t for t in (BF16, FP16, F32, AMX)}


def pack(w: np.ndarray, arch: str = "x86_64", kt: KernelType = BF16) -> np.ndarray:
    """[K, N] float32 -> bfloat16 (a type the C++ runner loads, as it does not uint16) as the arch's kernel reads
    them: x86-64 [N/16, K2, 16, 2] (K2 = K/2 rounded up, a zero row past an odd K: vdpbf16ps's input pairs x 16
    outputs); aarch64 pack_bfmmla's."""
    if kt is FP16:
        return pack_fp16(w)
    if kt is F32:  # [N/16, K, 16]: every input's 16 weights of a column block, one stream per block
        k, n = w.shape
        return np.ascontiguousarray(w.reshape(k, n // BLOCK, BLOCK).transpose(1, 0, 2))  # float32: takes()
    if arch == "aarch64":
        return pack_bfmmla(w)
    k, n = w.shape
    k2 = -(-k // 32) * 16 if kt is AMX else -(-k // 2)  # AMX: whole B tiles of 16 input pairs
    padded = np.zeros((2 * k2, n), np.float32)
    padded[:k] = w
    bits = padded.astype(ml_dtypes.bfloat16)
    return np.ascontiguousarray(bits.reshape(k2, 2, n // BLOCK, BLOCK).transpose(2, 0, 3, 1))


def pack_bfmmla(w: np.ndarray) -> np.ndarray:
    """[K, N] float32 -> [N/16, 2, K4, 32] bf16 (K4 = K/4 rounded up, zeros past K): for each 8 columns
    (two per block of 16) and 4 inputs, 4 column pairs x 2 columns x 4 inputs, bfmmla's right operand per pair."""
    k, n = w.shape
    k4 = -(-k // 4)
    padded = np.zeros((4 * k4, n), np.float32)
    padded[:k] = w
    bits = padded.astype(ml_dtypes.bfloat16)  # [q, i, c8, p, j] -> [c8, q, p, j, i]
    blocks = bits.reshape(k4, 4, n // 8, 4, 2).transpose(2, 0, 3, 4, 1)
    return np.ascontiguousarray(blocks.reshape(n // BLOCK, 2, k4, 32))


def pack_fp16(w: np.ndarray) -> np.ndarray:
    """[K, N] float32 -> [N/16, 2, K, 8] float16: for each 8 columns, every input's 8 weights (fp16_matmul_arm.c)."""
    k, n = w.shape
    blocks = w.astype(np.float16).reshape(k, n // 8, 8).transpose(1, 0, 2)
    return np.ascontiguousarray(blocks.reshape(n // BLOCK, 2, k, 8))


def tile_rows(m: int) -> int:
    """The register tile's rows for M rows: the tile that pads M less; at equal padding 8 x 3 up to 256 rows (it
    loads fewer weight vectors per row) and 6 x 4 above (its fewer column groups re-read a large x fewer
    times). Single-core timings of both in benchmarks/history.md."""
    p8, p6 = -(-m // 8) * 8, -(-m // 6) * 6
    return 8 if p8 < p6 or (p8 == p6 and m <= 256) else 6


def tasks(m: int, blocks: int, f32_depth: int = 0, amx: bool = False) -> tuple[int, int, int, int]:
    """(rows per task, column tasks, tile rows, column groups per task): a task is one column group (the tile's
    blocks) over all rows, its weights read into cache once; the rows are split as well where there are fewer than
    MIN_TASKS groups, in multiples of the tile's rows (evenly: uneven row tasks leave a thread idle). For the fp32
    kernel (f32_depth: its K, float32 x and weights), where x is past L2 and a group's weights are small, a task
    takes as many groups as fit in half of L2 (the rest holds x's chunk) while MIN_TASKS tasks (an even number)
    remain, so x streams from L3 once per task, not per group; more groups than that ran slower
    (benchmarks/history.md). amx: the AMX kernel's steps of 32 rows x 2 column blocks."""
    tile = AMX_ROWS if amx else tile_rows(m)
    groups = -(-blocks // TILES[tile])
    per = 1
    if f32_depth and 4 * m * f32_depth > CACHE_BYTES:
        group_bytes = 4 * BLOCK * f32_depth * TILES[tile]
        per = max(1, min(groups // MIN_TASKS, CACHE_BYTES // 2 // group_bytes))  # with x's chunk: in L2
        while per > 1 and -(-groups // per) % 2:  # an even task count: an odd one left a thread of two idle
            per -= 1
    col_tasks = -(-groups // per)
    row_tasks = min(-(-MIN_TASKS // col_tasks), -(-m // tile))
    rows = -(-m // row_tasks)
    return -(-rows // tile) * tile, col_tasks, tile, per


ACTIVATIONS = {"gelu_erf": 2, "gelu_tanh": 4, "relu": 8}  # bf16_matmul.c: MM_GELU_ERF, MM_GELU_TANH, MM_RELU


@dataclasses.dataclass(frozen=True)
class MatmulEpilogue:
    """What the kernel does to each output vector as it stores it: + bias, the activation, + residual, in that
    order; written in float32 and/or bf16 (for the bf16 matmul that reads it next)."""

    bias: bool = False
    residual: bool = False
    activation: str | None = None  # a key of ACTIVATIONS
    float32: bool = True
    bf16: bool = False

    @property
    def flags(self) -> int:  # bf16_matmul.c: MM_RES | the activation's flag
        return self.residual | ACTIVATIONS.get(self.activation, 0)


def kernel_func(
    x_shape: list[int],
    k: int,
    n: int,
    x_bf16: bool,
    ep: MatmulEpilogue = MatmulEpilogue(),
    out_shape=None,
    w_shape=None,
    kt: KernelType = BF16,
):
    """The PrimFunc calling the kernel for every task in parallel; x_bf16: x comes as bf16 (K even). Its
    parameters: x, the packed weights, the epilogue's bias [N] and residual (float32, the output's shape) where
    it has them, then its outputs (float32, bf16). The epilogue is kept in the `kiln.bf16_matmul` attribute
    (bias, flags, outputs) so FuseBF16MatmulEpilogue knows which kernels it has not extended yet. out_shape:
    the outputs' shape where a reshape of [..., M, N] (the same row-major elements) is what reads them; w_shape:
    the packed weights' shape (`pack`'s for the target; None: x86-64's); kt: the bf16 or the fp16 kernel (x_bf16
    then means x comes as fp16, and the 16-bit output is fp16)."""
    m = int(np.prod(x_shape[:-1]))
    k2, blocks = -(-k // 2), n // BLOCK
    task_rows, col_tasks, tile, per = tasks(m, blocks, k if kt is F32 else 0, kt is AMX)
    group = TILES[tile] * per
    row_tasks = -(-m // task_rows)
    out_shape = list(out_shape or [*x_shape[:-1], n])
    params = [
        ("x", x_shape, kt.dtype if x_bf16 else "float32"),
        ("w", list(w_shape or [blocks, k2, BLOCK, 2]), kt.dtype),
    ]
    params += [("bias", [n], "float32")] * ep.bias + [("res", out_shape, "float32")] * ep.residual
    params += [("out", out_shape, "float32")] * ep.float32 + [("out16", out_shape, kt.dtype)] * ep.bf16
    names = {p for p, _, _ in params}
    ptrs = ", ".join(f"{p}.data" if p in names else "T.int64(0)" for p in ("bias", "res", "out", "out16"))
    x_args = "T.int64(0), x.data" if x_bf16 else "x.data, T.int64(0)"
    info = [int(ep.bias), ep.flags, int(ep.float32), int(ep.bf16)]
    head, body = parallel_tasks.loop(row_tasks * col_tasks)
    src = f"""
@T.prim_func
def func({", ".join(f'{p}: T.Buffer({tuple(s)}, "{d}")' for p, s, d in params)}):
    T.func_attr({{"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8, "kiln.bf16_matmul": {info},
                 "kiln.kernel_kind": "{kt.kernel_kind}", "{C_KERNEL_ATTR}": "{kt.source}",
                 "kiln.flops": {2 * m * k * n}}})
{head}{body}T.evaluate(T.call_extern("int32", "{kt.function}", {x_args}, w.data, {ptrs}, {ep.flags}, {tile}, {m}, {n},
                                 {k}, t // {col_tasks} * {task_rows}, {task_rows}, t % {col_tasks} * {group},
                                 T.min(t % {col_tasks} * {group} + {group}, {blocks})))
"""  # 8: opaque, FuseOps leaves it alone
    return tvm.script.from_source(src)


def _bias(call, uses: dict, lookup):
    """(matmul call, bias constant) for add(matmul, [N] constant) in either order (the TorchScript exporter
    writes add(bias, matmul)) whose matmul is read only there, else None."""
    if op_name(call) != "relax.add":
        return None
    mm, b = call.args if isinstance(call.args[1], GenericConst) else (call.args[1], call.args[0])
    if not isinstance(b, GenericConst):
        return None
    inner = lookup(mm) if isinstance(mm, relax.Var) and uses.get(mm, 0) == 1 else None
    if inner is None or not takes(inner) or str(b.value.dtype) != "float32":
        return None
    n = int(inner.args[1].value.shape[1])
    return (inner, b) if list(b.value.shape) in ([n], [1, n]) else None


def _absorbed(mod: tvm.IRModule, uses: dict) -> list:
    """The weights of the matmuls a bias add will take in (their add is rewritten, not the matmul alone)."""
    found = []
    for f in mod.functions.values():
        if not isinstance(f, relax.Function):
            continue
        values = {}
        for block in getattr(f.body, "blocks", []):
            for b in block.bindings:
                values[b.var] = b.value
                got = _bias(b.value, uses, values.get) if isinstance(b.value, relax.Call) else None
                if got is not None:
                    found.append(got[0].args[1])
    return found


def _rewrite(builder, call, uses, lookup, absorbed: list, arch: str, kt: KernelType):
    fused = _bias(call, uses, lookup)
    mm, b = fused if fused else (call, None)
    if fused is None and (not takes(call) or any(call.args[1].same_as(w) for w in absorbed)):
        return None
    w, n = _padded(mm.args[1].value.numpy()), int(mm.args[1].value.shape[1])
    x_shape = float32_shape(mm.args[0])
    # the cast fuses into x's producer, which then writes bf16/fp16; the fp32 kernel reads x as it is
    x_bf16 = kt is FP16 or (kt in (BF16, AMX) and w.shape[0] % 2 == 0)
    packed = pack(w, arch, kt)
    ep = MatmulEpilogue(bias=b is not None)
    func = kernel_func(x_shape, w.shape[0], w.shape[1], x_bf16, ep, None, packed.shape, kt)
    gv = builder.add_func(func.without_attr("global_symbol"), kt.source)
    x = builder.emit(relax.op.astype(mm.args[0], kt.dtype)) if x_bf16 else mm.args[0]
    args = [x, relax.const(packed, kt.dtype)]
    if b is not None:
        args.append(relax.const(_padded(b.value.numpy().reshape(1, -1))[0], "float32"))
    out = relax.call_tir(gv, args, relax.TensorType([*x_shape[:-1], int(w.shape[1])], "float32"))
    if n == w.shape[1]:
        return out
    return relax.op.strided_slice(builder.emit(out), axes=[len(x_shape) - 1], begin=[0], end=[n])


def _padded(w: np.ndarray) -> np.ndarray:
    """[K, N] weights (or a [1, N] bias) with zero columns up to a multiple of the kernel's 16-column block."""
    pad = -w.shape[1] % BLOCK
    return np.ascontiguousarray(np.pad(w, ((0, 0), (0, pad))) if pad else w)


def take_matmuls(mod: tvm.IRModule, arch: str, kt: KernelType) -> tuple[tvm.IRModule, int]:
    """The module with every matmul the kernel takes (`takes`, with its bias) rewritten to call it, and their
    count (`mod` itself where none)."""
    uses = module_var_uses(mod)
    absorbed = _absorbed(mod, uses)
    out, count = rewrite_calls(
        mod, lambda b, call, lookup: _rewrite(b, call, uses, lookup, absorbed, arch, kt), lookup=True
    )
    if not count:
        return mod, 0
    from ...runtime.hostinfo import host_arch
    from ...schedules.kernels import build

    if arch == host_arch():  # compiled and loaded before an in-process build references its symbol
        build(kt.source)  # (another arch's build is compiled when the artifact is linked: export.c_kernels)
    return relax.transform.DeadCodeElimination(["main"])(out), count


# what BF16MatmulKernel counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("bf16_kernel_matmuls", int, "matmuls on Kiln's bf16 matmul kernel (vdpbf16ps, bfmmla)", always=True),
)


@tvm.transform.module_pass(opt_level=2, name="BF16MatmulKernel")
class BF16MatmulKernel:
    COUNTERS = COUNTERS

    def __init__(self, arch: str = "x86_64", amx: bool = False):
        self.arch = arch  # the target's: which kernel build, and its weight packing
        self.kt = AMX if amx else BF16  # amx: the target has AMX-BF16 (caps.bf16 is BF16.AMX): the tile kernel
        self.stats = {"bf16_kernel_matmuls": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        out, count = take_matmuls(mod, self.arch, self.kt)
        self.stats["bf16_kernel_matmuls"] += count
        return out


__all__ = ["BF16MatmulKernel"]
