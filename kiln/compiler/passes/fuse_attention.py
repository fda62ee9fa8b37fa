"""FuseAttention: scaled dot-product attention, softmax(Q Kᵀ * scale + mask) V, as one kernel per
(batch x head, block of query rows) on Kiln's C kernel (kiln/schedules/kernels/attention.c): an online
(streaming) softmax over blocks of keys, so the scores are never written out. Unfused, Whisper-tiny's
encoder wrote and read 6 x 1500 x 1500 scores per layer (54 MB) three times (Q Kᵀ, softmax, · V) and its
softmax, on 1500-wide rows no whole vector of 16 divides, ran scalar: those three kernels were half the
model's time (timings in benchmarks/history.md).

It takes the chain as both torch exporters write it, over static float32 tensors of rank 3 or 4:
matmul(Q, Kᵀ) [* or / a scalar constant] [+ an additive mask that broadcasts over batch, heads or query
rows] -> softmax(axis=-1) -> matmul(·, V), each intermediate read only by the next. Kᵀ is the keys
transposed ([..., D, N]: a key's features down a column, as the exporters' Transpose leaves it), V
[..., N, DV] with DV a multiple of the vector width. Hugging Face's SDPA path, which scales Q and Kᵀ
separately, matches with no scale. Only x86 targets with AVX-512 or AVX2+FMA have the kernel (one source,
built for each); elsewhere the chain stays as three kernels. With --precision bf16 on AVX512-BF16 (bf16=True)
a third build runs both matmuls on vdpbf16ps: Q cast to bf16 by its producer, Kᵀ and V packed in bf16 pairs,
the softmax in float32; on AMX-BF16 a fourth runs them on tiles of 16 query rows (heads of a multiple of 32
features; build_for). `stats["attention_fused"]` counts them; `stats["attention_bf16"]` the bf16 ones."""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
import tvm.script
from tvm import relax, te

from ...capabilities import BF16
from ...counters import Counter
from ...schedules.kernels import C_KERNEL_ATTR
from .. import parallel_tasks
from ..ir import module_var_uses, op_name, scalar_value
from .counting import float32_shape
from .module_map import rewrite_calls

ROWS_PER_TASK = 24  # query rows per parallel task: a multiple of the kernel's tile rows (6 on AVX-512, 4 on AVX2)
AMX_ROWS_PER_TASK = 32  # on AMX tiles of 16 query rows
# target vector family -> (C function, kernels.SOURCES entry, float32 lanes (DV is a multiple of them), keys per
# block (the C build's KB: K^T is packed by it))
KERNELS = {
    "avx512": ("kiln_attention_f32", "attention_avx512", 16, 128),
    "avx2": ("kiln_attention_f32_avx2", "attention_avx2", 8, 32),
    "avx512_bf16": ("kiln_attention_bf16", "attention_bf16", 16, 128),
    "amx_bf16": ("kiln_attention_amx", "attention_amx", 16, 128),  # AMX-BF16 tiles, the bf16 build's packing
}
FALLBACK = {"avx512_bf16": "avx512", "amx_bf16": "avx512_bf16"}  # where a head's shape does not suit a build


@dataclasses.dataclass(frozen=True)
class Attention:
    """One matched chain: its operands, the scale applied to the scores, and the mask (None: no mask)."""

    q: relax.Expr
    kt: relax.Expr
    v: relax.Expr
    scale: float
    mask: relax.Expr | None


def _single(e, uses: dict, lookup):
    """The call a Var read only once is bound to, else None."""
    return lookup(e) if isinstance(e, relax.Var) and uses.get(e, 0) == 1 else None


def _nan_guarded(e, uses: dict, lookup):
    """p for where(isnan(p), 0, p) (BERT's exports guard the probabilities of fully masked rows), else None.
    The kernel writes 0 for such rows, as the guard does."""
    w = _single(e, uses, lookup)
    if op_name(w) != "relax.where" or scalar_value(w.args[1]) != 0.0:
        return None
    cond, p = lookup(w.args[0]) if isinstance(w.args[0], relax.Var) else None, w.args[2]
    if op_name(cond) != "relax.isnan" or not cond.args[0].same_as(p) or uses.get(p, 0) != 2:
        return None
    return p if uses.get(w.args[0], 0) == 1 else None


def match(call, uses: dict, lookup) -> Attention | None:
    """The attention chain ending in `call` (the matmul by V), or None."""
    if op_name(call) != "relax.matmul":
        return None
    probs, v = call.args
    guarded = _nan_guarded(probs, uses, lookup)
    soft = lookup(guarded) if guarded is not None else _single(probs, uses, lookup)
    probs = guarded if guarded is not None else probs
    if op_name(soft) != "relax.nn.softmax" or int(soft.attrs.axis) not in (-1, len(probs.ty.shape.values) - 1):
        return None
    x, mask, scale = soft.args[0], None, 1.0
    add = _single(x, uses, lookup)
    if op_name(add) == "relax.add" and scalar_value(add.args[1]) is None and scalar_value(add.args[0]) is None:
        x, mask = add.args
        scores = ("relax.matmul", "relax.multiply", "relax.divide")
        if op_name(_single(mask, uses, lookup)) in scores and op_name(_single(x, uses, lookup)) not in scores:
            x, mask = mask, x  # add(mask, scores)
    scaled = _single(x, uses, lookup)
    if op_name(scaled) in ("relax.multiply", "relax.divide") and scalar_value(scaled.args[1]) is not None:
        s = scalar_value(scaled.args[1])
        scale, x = (s if op_name(scaled) == "relax.multiply" else 1.0 / s), scaled.args[0]
    qk = _single(x, uses, lookup)
    if op_name(qk) != "relax.matmul":
        return None
    return Attention(qk.args[0], qk.args[1], v, scale, mask)


def geometry(a: Attention, lanes: int) -> dict | None:
    """The kernel's sizes and mask strides for a match, or None when its shapes are not the kernel's."""
    q, kt, v = (float32_shape(e) for e in (a.q, a.kt, a.v))
    if q is None or kt is None or v is None or len(q) not in (3, 4) or not len(q) == len(kt) == len(v):
        return None
    *lead, m, d = q
    if kt[:-2] != lead or v[:-2] != lead or kt[-2] != d or v[-2] != kt[-1] or v[-1] % lanes or v[-1] > 256:
        return None
    n, heads = kt[-1], lead[-1] if len(lead) == 2 else 1
    g = {"lead": lead, "M": m, "N": n, "D": d, "DV": v[-1], "bh": int(np.prod(lead)), "mask": None}
    if a.mask is None:
        return g
    mask = float32_shape(a.mask)
    if mask is None or len(mask) > 4 or mask[-1] != n:
        return None
    mb, mh, mm = ([1] * (4 - len(mask)) + mask)[:3]
    batch = lead[0] if len(lead) == 2 else g["bh"]
    if mm not in (1, m) or mh not in (1, heads) or mb not in (1, batch) or (len(lead) == 1 and mh != 1):
        return None
    slab = mm * n if mb * mh > 1 else 0  # one [rows, N] slab of the mask
    div, mod = (heads, mb) if mh == 1 else (1, mh * mb)
    g["mask"] = {"bh": slab, "row": n if mm == m else 0, "div": div, "mod": mod, "shape": mask}
    return g


def pack_keys(kt, kb: int):
    """K^T [..., D, N] -> [..., N/kb, D, kb] (N rounded up, zeros past it): each block of kb keys contiguous,
    as the C kernel reads it. An injective kernel: FuseOps fuses it with the transpose that makes K^T."""
    *lead, d, n = (int(v) for v in kt.shape)
    nb = -(-n // kb)

    def at(*i):
        j = i[-3] * kb + i[-1]
        return te.if_then_else(j < n, kt[(*i[:-3], i[-2], te.min(j, n - 1))], tvm.tirx.const(0, "float32"))

    return te.compute((*lead, nb, d, kb), at, name="attention_keys")


def pack_keys_bf16(kt, kb: int):
    """K^T [..., D, N] float32 -> [..., N/kb, D/2, kb, 2] bf16 (N rounded up, zeros past it): pairs of a key's
    features, as the bf16 kernel's vdpbf16ps reads them."""
    *lead, d, n = (int(v) for v in kt.shape)

    def at(*i):
        j, f = i[-4] * kb + i[-2], 2 * i[-3] + i[-1]
        value = kt[(*i[:-4], f, te.min(j, n - 1))].astype("bfloat16")
        return te.if_then_else(j < n, value, tvm.tirx.const(0, "bfloat16"))

    return te.compute((*lead, -(-n // kb), d // 2, kb, 2), at, name="attention_keys_bf16")


def pack_values_bf16(v, kb: int):
    """V [..., N, DV] float32 -> [..., N/kb * kb/2, DV, 2] bf16 (zeros past N): pairs of keys per feature."""
    *lead, n, dv = (int(x) for x in v.shape)
    rows = -(-n // kb) * kb

    def at(*i):
        j = 2 * i[-3] + i[-1]
        value = v[(*i[:-3], te.min(j, n - 1), i[-2])].astype("bfloat16")
        return te.if_then_else(j < n, value, tvm.tirx.const(0, "bfloat16"))

    return te.compute((*lead, rows // 2, dv, 2), at, name="attention_values_bf16")


def kernel_func(g: dict, scale: float, function: str, source: str, kb: int, bf16: bool = False):
    """The PrimFunc calling the C kernel for every (batch x head, block of ROWS_PER_TASK rows) in parallel;
    bf16: q, K^T and V in bf16, packed as pack_keys_bf16 and pack_values_bf16 write them."""
    lead, m, n, d, dv = g["lead"], g["M"], g["N"], g["D"], g["DV"]
    nb, t = -(-n // kb), "bfloat16" if bf16 else "float32"
    params = [("q", [*lead, m, d], t)]
    if bf16:
        params += [("kt", [*lead, nb, d // 2, kb, 2], t), ("v", [*lead, nb * kb // 2, dv, 2], t)]
    else:
        params += [("kt", [*lead, nb, d, kb], t), ("v", [*lead, n, dv], t)]
    mk = g["mask"] or {"bh": 0, "row": 0, "div": 1, "mod": 1}
    if g["mask"] is not None:
        params.append(("mask", g["mask"]["shape"], "float32"))
    params.append(("out", [*lead, m, dv], "float32"))
    rows = AMX_ROWS_PER_TASK if source == KERNELS["amx_bf16"][1] else ROWS_PER_TASK
    per_head = -(-m // rows)
    flops = 2 * g["bh"] * m * n * (d + dv)
    mask_ptr = "mask.data" if g["mask"] is not None else "T.int64(0)"  # the kernel reads no mask
    head, body = parallel_tasks.loop(g["bh"] * per_head)
    src = f"""
@T.prim_func
def func({", ".join(f'{p}: T.Buffer({tuple(s)}, "{dt}")' for p, s, dt in params)}):
    T.func_attr({{"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8, "kiln.kernel_kind": "attention",
                 "{C_KERNEL_ATTR}": "{source}", "kiln.flops": {flops}}})
{head}{body}T.evaluate(T.call_extern("int32", "{function}", q.data, kt.data, v.data, {mask_ptr}, out.data,
                                 {m}, {n}, {d}, {dv}, T.float32({scale!r}), T.int64({mk["bh"]}), T.int64({mk["row"]}),
                                 {mk["div"]}, {mk["mod"]}, 0, {n - m}, t // {per_head},
                                 t % {per_head} * {rows}, {rows}))
"""  # 8: opaque, FuseOps leaves it alone
    return tvm.script.from_source(src)


def _rewrite(builder, call, uses, lookup, isa: str, stats: dict):
    a = match(call, uses, lookup)
    g = geometry(a, KERNELS[isa][2]) if a is not None else None
    if g is None:
        return None
    isa = build_for(isa, g["D"])
    bf16 = isa in ("avx512_bf16", "amx_bf16")
    function, source, _, kb = KERNELS[isa]
    if bf16:  # q's cast fuses into its producer; the packs read float32 and write bf16
        q = builder.emit(relax.op.astype(a.q, "bfloat16"))
        keys = builder.emit(builder.call_te(pack_keys_bf16, a.kt, kb, primfunc_name_hint="attention_keys"))
        values = builder.emit(builder.call_te(pack_values_bf16, a.v, kb, primfunc_name_hint="attention_values"))
        args = [q, keys, values]
        stats["attention_bf16"] += 1
    else:
        args = [a.q, builder.emit(builder.call_te(pack_keys, a.kt, kb, primfunc_name_hint="attention_keys")), a.v]
    if a.mask is not None:
        args.append(a.mask)
    func = kernel_func(g, a.scale, function, source, kb, bf16)
    gv = builder.add_func(func.without_attr("global_symbol"), "attention")
    return relax.call_tir(gv, args, relax.TensorType([*g["lead"], g["M"], g["DV"]], "float32"))


def build_for(isa: str, d: int) -> str:
    """The build a head of D features runs on: the AMX build needs whole A tiles of 32 features (D <= 256), the
    bf16 builds feature pairs (D even); else the next build down (FALLBACK)."""
    fits = {"amx_bf16": d % 32 == 0 and d <= 256, "avx512_bf16": d % 2 == 0}
    while isa in FALLBACK and not fits[isa]:
        isa = FALLBACK[isa]
    return isa


def kernel_isa(caps, bf16: bool = False) -> str | None:
    """The attention kernel build for a target's capabilities, or None where it has none; bf16: the bf16
    build (--precision bf16 on a CPU with vdpbf16ps; on AMX tiles where it has AMX-BF16)."""
    if caps.arch != "x86_64" or not caps.fma or caps.isa not in KERNELS:
        return None
    if not (bf16 and caps.isa == "avx512" and caps.has_vdpbf16ps):
        return caps.isa
    return "amx_bf16" if caps.bf16 is BF16.AMX else "avx512_bf16"


# what FuseAttention counts in the report (kiln/counters.py)
COUNTERS: tuple[Counter, ...] = (
    Counter("attention_fused", int, "attention chains on the fused streaming-softmax kernel", always=True),
    Counter("attention_bf16", int, "fused attention kernels whose matmuls run in bf16 (vdpbf16ps)"),
)


@tvm.transform.module_pass(opt_level=2, name="FuseAttention")
class FuseAttention:
    COUNTERS = COUNTERS

    def __init__(self, isa: str):
        self.isa = isa
        self.stats = {"attention_fused": 0, "attention_bf16": 0}

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        uses = module_var_uses(mod)
        out, count = rewrite_calls(
            mod, lambda b, call, lookup: _rewrite(b, call, uses, lookup, self.isa, self.stats), lookup=True
        )
        if not count:
            return mod
        from ...schedules.kernels import build

        isa = self.isa
        while isa:  # every build a head may fall back to, compiled and loaded before anything calls them
            build(KERNELS[isa][1])
            isa = FALLBACK.get(isa)
        self.stats["attention_fused"] += count
        return relax.transform.DeadCodeElimination(["main"])(out)


__all__ = ["FuseAttention", "kernel_isa"]
