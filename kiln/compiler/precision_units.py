"""Which precision each kernel computes in and which unit of the CPU runs it, and why a multiply-add kernel of a
reduced-precision build stayed wider: what `kiln inspect` prints per layer and the manifest's kernel_info records
(`precision`, `unit`, `why`), so `--precision bf16` is honest about the layers it did not make faster.

A kernel's precision is its multiply-add's: Kiln's C kernels say theirs by kind (vdpbf16ps, AMX tiles, bfmmla and
fp16 fmla on arm64); an int8 kernel runs on the target's int8 path (VNNI, AMX, pmaddubsw); every other TVM kernel
computes in float32 vector registers, also where its operands are stored in bf16 or fp16 (TVM 0.27 converts them
around each op)."""

from __future__ import annotations

from ..capabilities import BF16
from ..runtime.profile import MULTIPLY_ADD  # the kinds whose FLOPs are multiply-adds (the bf16 ones return first)
from ..schedules.kernels import C_KERNEL_ATTR
from .passes.bf16_conv_kernel import ConvGeometry

AMX_C_KERNELS = ("amx_bf16_matmul", "attention_amx")  # the C kernels on AMX-BF16 tiles (beside the conv's flag)
WHY_WIDER = {  # a float32 multiply-add kernel of a bf16/fp16 build: what no reduced-precision kernel takes
    "attention": "activations x activations (Q K^T, P V) on a CPU without AVX512-BF16: the float32 attention kernel",
    "matmul": "no bf16/fp16 kernel for it: operands both activations, or columns not a multiple of 16",
    "depthwise_nchw": "grouped/depthwise conv: bf16 only adds conversions (TVM computes it in float32)",
    "depthwise_pointwise": "fused depthwise + pointwise block: float32",
}


def _fma_unit(caps) -> str:
    if caps.isa == "avx512":
        return "fp32 FMA avx512"
    if caps.isa == "neon":
        return "fp32 fmla neon"
    return f"fp32 FMA {caps.isa}" if caps.fma else f"fp32 {caps.isa}"


def describe(kind: str | None, int8: bool, amx_kernel: bool, reduced_storage: str | None, precision: str, caps) -> dict:
    """{precision, unit[, why]} for one kernel. reduced_storage: "bfloat16"/"float16" when TVM computes a kernel
    whose operands are stored so; precision: the build's --precision."""
    if kind == "fp16_matmul":  # fp16 products summed in fp16 over 16 inputs, then in float32
        return {"precision": "fp16", "unit": "arm-fp16 fmla .8h"}
    if kind == "bf16_matmul" and caps.bf16 is BF16.ARM:
        return {"precision": "bf16", "unit": "arm-bf16 bfmmla"}
    if kind in ("bf16_matmul", "bf16_conv", "attention_bf16"):
        return {"precision": "bf16", "unit": "amx-bf16 tdpbf16ps" if amx_kernel else "avx512-bf16 vdpbf16ps"}
    if int8 or kind in ("conv2d_int8", "matmul_int8", "conv2d_amx"):
        unit = "amx-int8" if kind == "conv2d_amx" else (caps.int8_dot or caps.int8_path)
        return {"precision": "int8", "unit": unit}
    if kind not in MULTIPLY_ADD:
        return {"precision": "fp32", "unit": "vector"}
    out = {"precision": "fp32", "unit": _fma_unit(caps)}
    if reduced_storage:
        out["unit"] += f" ({reduced_storage} stored, converted)"
    if precision != "fp32" and not reduced_storage:
        out["why"] = WHY_WIDER.get(kind, f"no {precision} kernel takes this {kind}")
    return out


def kernel_precision(f, kind: str | None, int8: bool, precision: str, caps) -> dict:
    """describe() for a PrimFunc: its parameters' storage types and whether it is an AMX bf16 kernel (conv, matmul)."""
    reduced = {str(getattr(p.ty, "dtype", "")) for p in f.params} & {"bfloat16", "float16"}
    attrs = f.attrs if f.attrs is not None else {}
    c_kernel = str(attrs.get(C_KERNEL_ATTR, ""))
    geometry = ConvGeometry.of(attrs)
    amx = (geometry is not None and geometry.amx) or c_kernel in AMX_C_KERNELS
    if kind == "attention" and c_kernel in ("attention_bf16", "attention_amx"):
        kind = "attention_bf16"  # Q K^T and P V on vdpbf16ps or AMX tiles (FuseAttention's bf16 builds)
    return describe(kind, int8, amx, sorted(reduced)[0] if reduced and kind != "bf16_conv" else None, precision, caps)


def summary(kernel_info: dict) -> list[tuple[str, str, int, float]]:
    """(precision, unit, kernels, share of the FLOPs) per unit, most FLOPs first."""
    total = sum(v.get("flops", 0) * v.get("calls", 1) for v in kernel_info.values()) or 1
    rows: dict = {}
    for v in kernel_info.values():
        if "unit" not in v:
            continue
        key = (v["precision"], v["unit"])
        n, fl = rows.get(key, (0, 0))
        rows[key] = (n + 1, fl + v.get("flops", 0) * v.get("calls", 1))
    return sorted(((p, u, n, fl / total) for (p, u), (n, fl) in rows.items()), key=lambda r: -r[3])
