"""The CPU backend (LLVM: x86-64 and aarch64, the host or cross-compiled): Kiln's graph passes and
blocked layouts, TVM's lowering and fusion, then tuned records or Kiln's default schedules; the
library links Kiln's C kernels and the runtime's thread pool; `kiln tune` runs MetaSchedule."""

from __future__ import annotations

from tvm import relax

from ...capabilities import BF16, ISA
from ...schedules.rules.apply import ApplyDefaultSchedules, ApplyTuningDatabase
from ...schedules.rules.int8 import int8_kernel
from ...target import Kind
from .. import passes as kp
from ..legalize import legalize_map
from ..pipeline import PassSpec, Stage, select_rows
from .base import Backend


def _default_schedules(o):
    caps = o.target.caps
    return ApplyDefaultSchedules(o.target.tvm(), caps.f32_block, caps.vector_registers)


def _apply_tuning_database(o):
    """CPU targets give it their default rules' arguments, to tell records tuned against today's default
    from stale ones (GPU targets apply their records as they are: backends/cuda.py)."""
    caps = o.target.caps
    return ApplyTuningDatabase(o.tuning_db, o.target.tvm(), caps.f32_block, caps.vector_registers)


def attention_kernel(o) -> str | None:
    """The fused attention kernel's build for this target (passes/fuse_attention.kernel_isa), else None."""
    from ..passes.fuse_attention import kernel_isa

    return kernel_isa(o.target.caps, bf16=vdpbf16ps(o))


def vdpbf16ps(o) -> bool:
    """bf16 convs can run on Kiln's vdpbf16ps kernel (BF16ConvKernel): bf16 on a CPU with AVX512-BF16."""
    return o.precision == "bf16" and o.target.caps.has_vdpbf16ps


def blocked_stem(o) -> bool:
    """A float RGB stem conv is worth 2x2 space-to-depth blocks (SpaceToDepthStem): its 16 channels then take the
    bf16 conv kernel (bf16 on AVX512-BF16) or an int8 kernel (--quantize int8 where the target has one), where its
    3 channels kept it in float32 on TVM's schedule. (An integer stem, a QDQ model's, takes them wherever the
    target has an int8 kernel.)"""
    return vdpbf16ps(o) or (o.quantize == "int8" and int8_kernel(o.target.caps) is not None)


def bf16_matmul_kernel(o) -> bool:
    """bf16 matmuls by constant weights can run on Kiln's bf16 matmul kernel (BF16MatmulKernel): bf16 on a CPU
    with AVX512-BF16 (vdpbf16ps; AMX tiles where it has AMX-BF16) or Arm BF16 (bfmmla)."""
    return vdpbf16ps(o) or (o.precision == "bf16" and o.target.caps.bf16 is BF16.ARM)


def fp16_matmul_kernel(o) -> bool:
    """fp16 matmuls by constant weights can run on Kiln's fp16 matmul kernel (FP16MatmulKernel): fp16 on arm64
    with fp16 arithmetic (fullfp16). x86-64's AVX512-FP16 has no such kernel yet."""
    caps = o.target.caps
    return o.precision == "fp16" and caps.arch == "aarch64" and caps.native_fp16


def f32_matmul_kernel(o) -> bool:
    """float32 matmuls by constant weights run on Kiln's fp32 matmul kernel (F32MatmulKernel): an x86-64 target
    with AVX-512. Under bf16 with a bf16 kernel, BF16MatmulKernel takes them first."""
    caps = o.target.caps
    return caps.arch == "x86_64" and caps.isa is ISA.AVX512 and not bf16_matmul_kernel(o)


def f32_conv_kernel(o) -> bool:
    """float32 convs in NCHW16c run on Kiln's fp32 conv kernel (F32ConvKernel): an x86-64 target with AVX-512 and
    the blocked layout."""
    caps = o.target.caps
    return caps.arch == "x86_64" and caps.isa is ISA.AVX512 and o.layout == "NCHWc"


def precision_note(o) -> str | None:
    """Why --precision fp16/bf16 will not be faster on this target (None where it has the instructions):
    without them the reduced type is only storage, converted to float32 around every op."""
    caps = o.target.caps
    if o.precision == "bf16" and not caps.bf16:
        return (
            f"{caps.cpu} has no bf16 arithmetic (AVX512-BF16, AMX-BF16 or Arm BF16): bf16 is converted to float32 "
            "around every op, so the build will not be faster than float32 and may be slower; use --precision fp32 here"
        )
    if o.precision == "fp16" and not caps.native_fp16:
        return (
            f"{caps.cpu} has no fp16 arithmetic (AVX512-FP16 or Arm FP16): fp16 is converted to float32 around "
            "every op, so the build will not be faster than float32 and may be slower; use --precision fp32 here"
        )
    if o.precision == "fp16" and not fp16_matmul_kernel(o):  # x86-64's AVX512-FP16: TVM widens to fp32 FMAs
        better = " or --precision bf16 (its bf16 units)" if caps.bf16 else ""
        return (
            f"{caps.cpu} has fp16 arithmetic (AVX512-FP16) but Kiln has no fp16 kernels for it yet: fp16 is stored "
            "and converted to float32 for every multiply-add, so the build will not be faster than float32; use "
            f"--precision fp32{better} here"
        )
    return None


def _conv_kernels(o) -> frozenset:
    """The passes of this build that give reduced-precision convs and matmuls a kernel of their own
    (MixedPrecision converts only what they take): under bf16, BF16ConvKernel where the CPU has AVX512-BF16 and
    convs run blocked, BF16MatmulKernel where bf16_matmul_kernel and under fp16 FP16MatmulKernel where
    fp16_matmul_kernel (they take float32 matmuls, so MixedPrecision leaves them float32)."""
    on = {s.name for s in select_rows(ROWS, o.opt_level, o.disabled_passes)}
    matmul = on & {"BF16MatmulKernel"} if bf16_matmul_kernel(o) else set()
    matmul |= on & {"FP16MatmulKernel"} if fp16_matmul_kernel(o) else set()
    if not (vdpbf16ps(o) and o.layout == "NCHWc" and "BF16ConvKernel" in on):
        return frozenset(matmul)
    return frozenset(on & {"BF16ConvKernel", "Winograd"} | matmul)


def _min_reduced_winograd_tile(o) -> int:
    """The smallest Winograd F(m x m) a bf16/fp16 conv takes: 2 with no bf16 conv kernel; 4 on the vdpbf16ps
    kernel (F(2x2) ran slower than it); none on AMX tiles (8: no such tile), where ResNet-50 bf16 ran faster
    all direct than with its six F(4x4) convs (timings in benchmarks/history.md)."""
    if "BF16ConvKernel" not in _conv_kernels(o):
        return 2
    return 8 if o.target.caps.bf16 is BF16.AMX else 4


def channel_multiple(o) -> int:
    """What RemoveZeroChannels keeps channel counts a multiple of: the NCHWc block, so pruned convs stay blocked."""
    return 1 if o.layout in ("NCHW", "NHWC") else o.target.caps.f32_block


# Kiln's graph passes (before lowering)
GRAPH_ROWS: tuple[PassSpec, ...] = (
    PassSpec("StaticDataflow", lambda o: kp.StaticDataflow(), 0, required=True),  # TVM's passes see dataflow only
    PassSpec("ClipTakeIndices", lambda o: kp.ClipTakeIndices(), 0, required=True),  # no gather outside its data
    PassSpec("LowerQDQ", lambda o: kp.LowerQDQ(o.target.caps), 1),  # before FoldConstants folds the weights' DQ
    PassSpec("FoldQDQPairs", lambda o: kp.FoldQDQPairs(), 1),  # fake quantization between float ops: one rounding
    PassSpec("FoldConstants", lambda o: kp.FoldConstants(), 1),
    PassSpec("CanonicalizeClip", lambda o: kp.CanonicalizeClip(), 1),
    PassSpec("RemoveNoOps", lambda o: kp.RemoveNoOps(), 1),
    PassSpec("FoldBatchNorm", lambda o: kp.FoldBatchNorm(), 1),
    PassSpec("RemoveZeroChannels", lambda o: kp.RemoveZeroChannels(channel_multiple(o)), 1),  # pruned channels out
    PassSpec("DropDeadConvTaps", lambda o: kp.DropDeadConvTaps(), 1),  # taps that read only padding
    # strided 1x1 convs read a dense slice (not on an accelerator target: backends/vta)
    PassSpec("SubsampleStridedPointwise", lambda o: kp.SubsampleStridedPointwise(), 2),
    PassSpec(
        "SpaceToDepthStem",
        lambda o: kp.SpaceToDepthStem(blocked_stem(o)) if blocked_stem(o) or int8_kernel(o.target.caps) else None,
        2,
    ),  # RGB stems on 2x2 blocks
    PassSpec("ConvTransposeAsConv", lambda o: kp.ConvTransposeAsConv(), 1),  # after FoldBatchNorm folds into it
    PassSpec("ResizeAsMatmul", lambda o: kp.ResizeAsMatmul(), 1),
    PassSpec(
        "PatchConvAsMatmul",
        lambda o: kp.PatchConvAsMatmul() if f32_matmul_kernel(o) or bf16_matmul_kernel(o) else None,
        2,
    ),  # ViT's patch embedding on the matmul kernels
    PassSpec("Quantize", lambda o: None, 1),  # the calibrated QuantizeGraph, given by the quantize flow
    PassSpec("Int8Residuals", lambda o: kp.Int8Residuals() if o.quantize == "int8" else None, 2),  # uint8 residuals
    PassSpec(
        "HoistQuantize",
        lambda o: (
            kp.HoistQuantize(o.quantize == "int8") if o.quantize == "int8" or int8_kernel(o.target.caps) else None
        ),
        2,
    ),  # pools on uint8 (--quantize int8, QDQ models)
    PassSpec(
        "Conv1dAsConv2d",
        lambda o: kp.Conv1dAsConv2d(o.target.caps.f32_block) if o.layout in ("NCHWc", "NHWC") else None,
        2,
    ),  # before MixedPrecision, which converts conv2d (Whisper's front-end convs run on the bf16 kernel)
    PassSpec(
        "MixedPrecision",
        lambda o: kp.MixedPrecision(o.precision, _conv_kernels(o)) if o.precision != "fp32" else None,
        1,
    ),
    PassSpec("ConvertLayout", lambda o: kp.ConvertLayout(o.layout, o.target.caps.f32_block), 2),
    PassSpec(
        "NarrowBlockLayout",
        lambda o: kp.NarrowBlockLayout(o.layout, o.target.caps.f32_block, int8_kernel(o.target.caps)),
        2,
    ),
    PassSpec("BlockGroupedConv", lambda o: kp.BlockGroupedConv(o.layout, o.target.caps.f32_block), 2),
    PassSpec("PropagateBlockedLayout", lambda o: kp.PropagateBlockedLayout(o.layout), 2),
    PassSpec(
        "Winograd", lambda o: kp.Winograd(_min_reduced_winograd_tile(o), small_direct=f32_conv_kernel(o)), 2
    ),  # small F(2x2) maps direct where the fp32 conv kernel takes them
    PassSpec(
        "BF16ConvKernel", lambda o: kp.BF16ConvKernel(o.target.caps.bf16 is BF16.AMX) if vdpbf16ps(o) else None, 2
    ),  # the bf16 convs Winograd did not take
    PassSpec("HoistBF16Casts", lambda o: kp.HoistBF16Casts() if vdpbf16ps(o) else None, 2),  # pools, slices in bf16
    PassSpec("BF16Residuals", lambda o: kp.BF16Residuals() if vdpbf16ps(o) else None, 2),  # the residuals in bf16
    PassSpec("FuseDepthwisePointwise", lambda o: kp.FuseDepthwisePointwise(), 2),
    PassSpec("F32ConvKernel", lambda o: kp.F32ConvKernel() if f32_conv_kernel(o) else None, 2),  # what is left
    PassSpec(
        "FuseBF16Epilogue", lambda o: kp.FuseBF16Epilogue() if vdpbf16ps(o) or f32_conv_kernel(o) else None, 2
    ),  # the bf16 and fp32 conv kernels' epilogues
    PassSpec("MergeSiblingMatmuls", lambda o: kp.MergeSiblingMatmuls(), 2),  # before PackDenseWeights packs each
    PassSpec("FuseAttention", lambda o: kp.FuseAttention(isa) if (isa := attention_kernel(o)) else None, 2),
    PassSpec(
        "BF16MatmulKernel",
        lambda o: kp.BF16MatmulKernel(o.target.arch, o.target.caps.bf16 is BF16.AMX) if bf16_matmul_kernel(o) else None,
        2,
    ),
    PassSpec("FP16MatmulKernel", lambda o: kp.FP16MatmulKernel(o.target.arch) if fp16_matmul_kernel(o) else None, 2),
    PassSpec("F32MatmulKernel", lambda o: kp.F32MatmulKernel(o.target.arch) if f32_matmul_kernel(o) else None, 2),
    PassSpec(
        "FuseBF16MatmulEpilogue",
        lambda o: (
            kp.FuseBF16MatmulEpilogue()
            if bf16_matmul_kernel(o) or fp16_matmul_kernel(o) or f32_matmul_kernel(o)
            else None
        ),
        2,
    ),  # the bf16, fp16 and fp32 matmul kernels' epilogues
    PassSpec(
        "PackDenseWeights", lambda o: kp.PackDenseWeights(o.target.caps.f32_block, o.target.caps.vector_registers), 2
    ),
    PassSpec("DeadCode", lambda o: kp.DeadCode(), 1),
    PassSpec("DecomposeOpsForInference", lambda o: relax.transform.DecomposeOpsForInference(), 0, required=True),
    PassSpec("FuseEpilogue", lambda o: kp.FuseEpilogue(), 2),
    PassSpec("ExpandQuantize", lambda o: kp.ExpandQuantize(), 1),  # a QDQ conv's quantize joins its epilogue
    PassSpec("FoldAffineChains", lambda o: kp.FoldAffineChains(), 1),  # BatchNorm's decomposition included
    # lowering: TVM's passes (tvm.compile does not fuse on CPU by itself)
)
# lowering: TVM's passes (tvm.compile does not fuse on CPU by itself)
LOWER_ROWS: tuple[PassSpec, ...] = (
    PassSpec(
        "LegalizeOps",
        lambda o: relax.transform.LegalizeOps(customize_legalize_map=legalize_map(o.target.caps)),
        0,
        required=True,
        graph=False,
    ),
    PassSpec("AnnotateTIROpPattern", lambda o: relax.transform.AnnotateTIROpPattern(), 0, required=True, graph=False),
    PassSpec("FoldConstantTIR", lambda o: relax.transform.FoldConstant(), 1, graph=False),
    PassSpec("CanonicalizeAliases", lambda o: kp.CanonicalizeAliases(), 1, graph=False),  # aliases hide producers
    PassSpec("FuseOps", lambda o: relax.transform.FuseOps(), 1, graph=False),
    PassSpec("FuseTIR", lambda o: relax.transform.FuseTIR(), 0, required=True, graph=False),
    PassSpec(
        "DeadCodeElimination", lambda o: relax.transform.DeadCodeElimination(["main"]), 0, required=True, graph=False
    ),
)
# kernels: tuned records where the database has them, else Kiln's default schedules
SCHEDULE_ROWS: tuple[PassSpec, ...] = (
    PassSpec("ApplyTuningDatabase", lambda o: _apply_tuning_database(o), 0, graph=False),
    PassSpec("DefaultSchedules", _default_schedules, 2, graph=False),
)

ROWS: tuple[PassSpec, ...] = GRAPH_ROWS + LOWER_ROWS + SCHEDULE_ROWS


class CPUBackend(Backend):
    kind = "cpu"
    target_kind = Kind.LLVM
    schedule_row = "DefaultSchedules"

    def rows(self, stage: Stage) -> tuple[PassSpec, ...]:
        by_stage = {Stage.GRAPH: GRAPH_ROWS, Stage.LOWER: LOWER_ROWS, Stage.SCHEDULE: SCHEDULE_ROWS}
        return by_stage[stage]

    def all_rows(self) -> list[PassSpec]:
        return list(ROWS)

    def precision_note(self, options) -> str | None:
        return precision_note(options)

    def tuning_target(self, target):
        """MetaSchedule needs num-cores ("llvm -mcpu=znver3" has none): this host's physical cores."""
        if target.num_cores:
            return target
        from ...runtime.hostinfo import physical_cores

        return target.with_cpu(num_cores=physical_cores())


CPU = CPUBackend()
