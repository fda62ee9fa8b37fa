"""Kiln's int8 dot-product tensor intrinsics, one per instruction family: each replaces the innermost
(lanes output channels x 4 inputs) of an int8 kernel, C[i] += sum_k A[k] * B[i, k] in int32, by
one or a few instructions on whole vector registers.

  VNNI_16x4       avx512-vnni  vpdpbusd zmm (EVEX)                 u8 x s8, 16 int32 lanes
  AVXVNNI_8x4     avx-vnni     vpdpbusd ymm (VEX, {vex} on AVX-512 CPUs too)  u8 x s8, 8 lanes
  PMADDUBSW_16x4  avx512bw     vpmaddubsw + vpmaddwd(ones) + vpaddd zmm   u8 x s8, 16 lanes
  PMADDUBSW_8x4   avx2         vpmaddubsw + vpmaddwd(ones) + vpaddd ymm   u8 x s8, 8 lanes
  SDOT_4x4        arm dotprod  sdot v.4s (both operands signed: the kernel shifts u8 data by -128)
  USDOT_4x4       arm i8mm     usdot v.4s                          u8 x s8, 4 lanes

vpmaddubsw sums each pair of u8*s8 products into a *saturating* int16: exact only while
|w0| + |w1| of same-signed neighbours stays <= 128 (docs/int8-kernels.md: Kiln's quantizer uses
weights in [-64, 64] for these targets). TVM 0.27 ships dot_16x4_vnni, but its body passes int32x16
vectors to llvm.x86.avx512.vpdpbusd.512, whose signature in the LLVM TVM links (22) takes byte
operands: the module fails LLVM verification. The bodies here pass bytes. (Importing
tvm.s_tir.tensor_intrin at all costs ~25 s: its package imports every target's intrinsics.)"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from .tvmscript import cheap_stack

VNNI_16x4 = "kiln_dot_16x4_vnni"
AVXVNNI_8x4 = "kiln_dot_8x4_avxvnni"
PMADDUBSW_16x4 = "kiln_dot_16x4_pmaddubsw"
PMADDUBSW_8x4 = "kiln_dot_8x4_pmaddubsw"
SDOT_4x4 = "kiln_dot_4x4_sdot"
USDOT_4x4 = "kiln_dot_4x4_usdot"


def _desc(lanes: int, a_dtype: str):
    """C[lanes] += A[4] (a_dtype) . B[lanes, 4] (int8), in int32: what every body below computes."""

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), a_dtype, offset_factor=1)
        B = T.match_buffer(b, (lanes, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return desc


def _dot(lanes: int, a_dtype: str, intrin: str):
    """One instruction: C = intrin(C, A broadcast to every 32-bit lane, B) (vpdpbusd, sdot, usdot)."""
    nbytes = 4 * lanes

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), a_dtype, offset_factor=1)
        B = T.match_buffer(b, (lanes, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            word = T.reinterpret(A.vload([0], f"{a_dtype}x4"), dtype="int32")
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(intrin),
                C.vload([0], dtype=f"int32x{lanes}"),
                T.reinterpret(T.broadcast(word, lanes), dtype=f"{a_dtype}x{nbytes}"),
                B.vload([0, 0], dtype=f"int8x{nbytes}"),
                dtype=f"int32x{lanes}",
            )

    return impl


def _pmaddubsw(lanes: int, ubsw: str, wd: str):
    """vpmaddubsw (u8*s8 pairs -> saturating int16) then vpmaddwd by ones (int16 pairs -> int32),
    added to C: the AVX2 / AVX-512BW sequence MLAS and oneDNN use where there is no VNNI."""
    nbytes = 4 * lanes

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (lanes, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            word = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            pairs = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(ubsw),
                T.reinterpret(T.broadcast(word, lanes), dtype=f"uint8x{nbytes}"),
                B.vload([0, 0], dtype=f"int8x{nbytes}"),
                dtype=f"int16x{2 * lanes}",
            )
            C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=f"int32x{lanes}") + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(wd), pairs, T.broadcast(T.int16(1), 2 * lanes), dtype=f"int32x{lanes}"
            )

    return impl


INTRINSICS = {
    VNNI_16x4: (16, "uint8", lambda: _dot(16, "uint8", "llvm.x86.avx512.vpdpbusd.512")),
    AVXVNNI_8x4: (8, "uint8", lambda: _dot(8, "uint8", "llvm.x86.avx512.vpdpbusd.256")),
    PMADDUBSW_16x4: (
        16,
        "uint8",
        lambda: _pmaddubsw(16, "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
    ),
    PMADDUBSW_8x4: (8, "uint8", lambda: _pmaddubsw(8, "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd")),
    SDOT_4x4: (4, "int8", lambda: _dot(4, "int8", "llvm.aarch64.neon.sdot.v4i32.v16i8")),
    USDOT_4x4: (4, "uint8", lambda: _dot(4, "uint8", "llvm.aarch64.neon.usdot.v4i32.v16i8")),
}


def register() -> None:
    with cheap_stack():  # TVMScript's inspect.stack() scans sys.modules per frame otherwise: seconds
        for name, (lanes, a_dtype, impl) in INTRINSICS.items():
            try:
                TensorIntrin.get(name)
            except Exception:  # not registered yet (TensorIntrin.get raises on unknown names)
                TensorIntrin.register(name, _desc(lanes, a_dtype), impl())


register()
