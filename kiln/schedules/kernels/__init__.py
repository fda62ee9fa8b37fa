"""Hand-written C kernels for instructions TVM 0.27 cannot emit (AVX512-BF16's vdpbf16ps, Arm BF16's bfmmla:
its LLVM code generator has no bfloat vector type), and for the float32 matmul and conv on AVX-512, which TVM's
schedules ran well below the FMA peak (f32_matmul.c: ragged row counts, fused epilogues; f32_conv.c). Compiled once
per target arch with that arch's C compiler (the host's, or the cross compiler), linked into every artifact library
that calls them, and, where the arch is the host's, loaded into this process (RTLD_GLOBAL) so in-process builds
resolve them too."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...env import kernel_cache
from ...errors import CompileError
from ...runtime.hostinfo import host_arch

HERE = Path(__file__).parent
C_KERNEL_ATTR = "kiln.c_kernel"  # a PrimFunc calling one of these kernels names its SOURCES key here
SOURCES = {  # x86-64 builds
    "bf16_conv": (HERE / "bf16_conv.c", ["-mavx512f", "-mavx512bf16"]),
    # one source, two builds: GCC vector extensions at 16 lanes (AVX-512) and 8 (AVX2); 256-bit loads unsplit
    "attention_avx512": (HERE / "attention.c", ["-mavx512f", "-mno-avx256-split-unaligned-load"]),
    "attention_avx2": (
        HERE / "attention.c",
        [
            "-mavx2",
            "-mfma",
            "-DKILN_VL=8",
            "-DKILN_ATTENTION=kiln_attention_f32_avx2",
            "-mno-avx256-split-unaligned-load",
            "-mno-avx256-split-unaligned-store",
        ],
    ),
    "attention_bf16": (
        HERE / "attention.c",
        ["-mavx512f", "-mavx512bf16", "-DKILN_BF16", "-DKILN_ATTENTION=kiln_attention_bf16"],
    ),
    "attention_amx": (
        HERE / "attention.c",
        ["-mavx512f", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-DKILN_BF16", "-DKILN_AMX"]
        + ["-DKILN_ATTENTION=kiln_attention_amx"],
    ),
    "bf16_matmul": (HERE / "bf16_matmul.c", ["-mavx512f", "-mavx512bw", "-mavx512bf16"]),
    "f32_matmul": (HERE / "f32_matmul.c", ["-mavx512f"]),
    "f32_conv": (HERE / "f32_conv.c", ["-mavx512f"]),
    "amx_bf16_matmul": (
        HERE / "amx_bf16_matmul.c",
        ["-mavx512f", "-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"],
    ),
    "amx_bf16_conv": (
        HERE / "amx_bf16_conv.c",
        ["-mavx512f", "-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"],
    ),
}
# aarch64 builds: the same symbols and signatures. armv8.2-a (not 8.6-a) so the compiler uses nothing beyond
# what Neoverse V1 (Graviton3, Armv8.4) has; +bf16 enables the BF16 extension's bfmmla alone, +fp16 fp16 arithmetic
# (fullfp16, which Cortex-A76 has too).
AARCH64_SOURCES = {
    "bf16_matmul": (HERE / "bf16_matmul_arm.c", ["-march=armv8.2-a+bf16"]),
    "fp16_matmul": (HERE / "fp16_matmul_arm.c", ["-march=armv8.2-a+fp16"]),
}
BY_ARCH = {"x86_64": SOURCES, "aarch64": AARCH64_SOURCES}
COMPILERS = {"x86_64": "x86_64-linux-gnu-gcc", "aarch64": "aarch64-linux-gnu-gcc"}  # where the host is another arch
FLAGS = ["-O3", "-fPIC"]


def source(name: str, arch: str) -> tuple[Path, list[str]]:
    """(C source, arch flags) of a kernel's build for `arch`."""
    got = BY_ARCH.get(arch, {}).get(name)
    if got is None:
        raise CompileError(f"Kiln's {name} kernel has no {arch} build", where=name, fix="compile with --precision fp32")
    return got


def compiler(name: str, arch: str) -> str:
    """The C compiler for `arch`: the host's own, or its cross compiler."""
    cc = (
        shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
        if arch == host_arch()
        else shutil.which(COMPILERS.get(arch, f"{arch}-linux-gnu-gcc"))
    )
    if cc is None:
        raise CompileError(
            f"the {name} kernel for {arch} needs a C compiler ({COMPILERS.get(arch, 'gcc')}) and none is installed",
            where="bf16",
            fix="install gcc (g++-aarch64-linux-gnu to cross-compile for arm64), or compile with --precision fp32",
        )
    return cc


def _compile(cc: str, src: Path, flags: list[str], obj: Path, so: Path) -> None:
    """Object and shared library, built beside and renamed into place: concurrent compiles are safe."""
    with tempfile.TemporaryDirectory(dir=obj.parent) as tmp:
        t_obj, t_so = Path(tmp) / obj.name, Path(tmp) / so.name
        for cmd in (
            [cc, *FLAGS, *flags, "-c", str(src), "-o", str(t_obj)],
            [cc, "-shared", str(t_obj), "-o", str(t_so)],
        ):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                raise CompileError(
                    f"compiling the {src.stem} kernel failed: "
                    f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}",
                    where=str(src),
                    fix=f"check that {Path(cc).name} supports {' '.join(flags)} (gcc 10+), or use --precision fp32",
                )
        os.replace(t_obj, obj)
        os.replace(t_so, so)


@functools.cache
def build(name: str, arch: str | None = None) -> tuple[str, str]:
    """(object file, shared library) of a kernel for `arch` (None: the host's), cached by arch and source digest
    in a per-user folder; loaded into this process when the arch is the host's."""
    arch = arch or host_arch()
    src, flags = source(name, arch)
    cc = compiler(name, arch)
    headers = b"".join(h.read_bytes() for h in sorted(src.parent.glob("*.h")))  # what the sources include
    digest = hashlib.sha256(src.read_bytes() + headers + " ".join([arch, *FLAGS, *flags]).encode()).hexdigest()[:16]
    root = kernel_cache()
    root.mkdir(parents=True, exist_ok=True)
    obj, so = root / f"{name}-{arch}-{digest}.o", root / f"{name}-{arch}-{digest}.so"
    if not so.exists():
        _compile(cc, src, flags, obj, so)
    if arch == host_arch():
        ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)  # in-process JIT builds resolve the symbol here
    return str(obj), str(so)
