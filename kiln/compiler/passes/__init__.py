"""Kiln's own Relax passes, one per file. Each records what it did in `.stats`."""

from .bf16_conv_kernel import BF16ConvKernel
from .bf16_matmul_kernel import BF16MatmulKernel
from .bf16_residuals import BF16Residuals
from .block_grouped_conv import BlockGroupedConv
from .canonicalize_aliases import CanonicalizeAliases
from .canonicalize_clip import CanonicalizeClip
from .clip_take_indices import ClipTakeIndices
from .conv1d_as_conv2d import Conv1dAsConv2d
from .conv_transpose_as_conv import ConvTransposeAsConv
from .convert_layout import ConvertLayout
from .dead_code import DeadCode
from .drop_dead_conv_taps import DropDeadConvTaps
from .expand_quantize import ExpandQuantize
from .f32_conv_kernel import F32ConvKernel
from .f32_matmul_kernel import F32MatmulKernel
from .fold_affine_chains import FoldAffineChains
from .fold_batchnorm import FoldBatchNorm
from .fold_constants import FoldConstants
from .fold_qdq_pairs import FoldQDQPairs
from .fp16_matmul_kernel import FP16MatmulKernel
from .fuse_attention import FuseAttention
from .fuse_bf16_epilogue import FuseBF16Epilogue
from .fuse_bf16_matmul_epilogue import FuseBF16MatmulEpilogue
from .fuse_depthwise_pointwise import FuseDepthwisePointwise
from .fuse_epilogue import FuseEpilogue
from .hoist_bf16_casts import HoistBF16Casts
from .hoist_quantize import HoistQuantize
from .int8_residuals import Int8Residuals
from .lift_weights import LiftWeights
from .lower_qdq import LowerQDQ
from .merge_sibling_matmuls import MergeSiblingMatmuls
from .mixed_precision import MixedPrecision
from .narrow_block_layout import NarrowBlockLayout
from .pack_dense_weights import PackDenseWeights
from .patch_conv_as_matmul import PatchConvAsMatmul
from .propagate_blocked_layout import PropagateBlockedLayout
from .remove_noops import RemoveNoOps
from .remove_zero_channels import RemoveZeroChannels
from .resize_as_matmul import ResizeAsMatmul
from .space_to_depth_stem import SpaceToDepthStem
from .static_dataflow import StaticDataflow
from .subsample_strided_pointwise import SubsampleStridedPointwise
from .winograd import Winograd

__all__ = [
    "BF16ConvKernel",
    "F32ConvKernel",
    "BF16MatmulKernel",
    "BF16Residuals",
    "BlockGroupedConv",
    "CanonicalizeAliases",
    "CanonicalizeClip",
    "ClipTakeIndices",
    "Conv1dAsConv2d",
    "ConvTransposeAsConv",
    "ConvertLayout",
    "DeadCode",
    "DropDeadConvTaps",
    "ExpandQuantize",
    "F32MatmulKernel",
    "FoldAffineChains",
    "FoldBatchNorm",
    "FoldConstants",
    "FoldQDQPairs",
    "FP16MatmulKernel",
    "FuseAttention",
    "FuseBF16Epilogue",
    "FuseBF16MatmulEpilogue",
    "FuseDepthwisePointwise",
    "FuseEpilogue",
    "HoistBF16Casts",
    "HoistQuantize",
    "Int8Residuals",
    "LiftWeights",
    "LowerQDQ",
    "MergeSiblingMatmuls",
    "MixedPrecision",
    "NarrowBlockLayout",
    "PackDenseWeights",
    "PatchConvAsMatmul",
    "PropagateBlockedLayout",
    "RemoveNoOps",
    "RemoveZeroChannels",
    "ResizeAsMatmul",
    "SpaceToDepthStem",
    "StaticDataflow",
    "SubsampleStridedPointwise",
    "Winograd",
]
