"""Kiln's tensor intrinsics. TVM 0.27 ships dot_16x4_vnni, but its body passes int32x16 vectors to
llvm.x86.avx512.vpdpbusd.512, whose signature in the LLVM TVM links (22) takes <64 x i8> operands:
the module fails LLVM verification. Same description, operands reinterpreted as bytes. (Importing
tvm.s_tir.tensor_intrin at all costs ~25 s: its package imports every target's intrinsics.)"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

VNNI_16x4 = "kiln_dot_16x4_vnni"


@T.prim_func(s_tir=True)
def _dot_16x4_desc(
    A: T.Buffer((4,), "uint8", offset_factor=1),
    B: T.Buffer((16, 4), "int8", offset_factor=1),
    C: T.Buffer((16,), "int32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        for i in T.serial(0, 16):
            for k in T.serial(0, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")


@T.prim_func(s_tir=True)
def _dot_16x4_vnni(
    A: T.Buffer((4,), "uint8", offset_factor=1),
    B: T.Buffer((16, 4), "int8", offset_factor=1),
    C: T.Buffer((16,), "int32", offset_factor=1),
) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16), dtype="uint8x64")
        C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
            C.vload([0], dtype="int32x16"),
            a,
            B.vload([0, 0], dtype="int8x64"),
            dtype="int32x16",
        )


def register() -> None:
    try:
        TensorIntrin.get(VNNI_16x4)
    except Exception:  # not registered yet (TensorIntrin.get raises on unknown names)
        TensorIntrin.register(VNNI_16x4, _dot_16x4_desc, _dot_16x4_vnni)


register()
