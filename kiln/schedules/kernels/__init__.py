"""Hand-written C kernels for instructions TVM 0.27 cannot emit (AVX512-BF16's vdpbf16ps: its LLVM
code generator has no bfloat vector type). Compiled once per process with the host C compiler,
linked into every artifact library that calls them, and loaded into this process (RTLD_GLOBAL)
so in-process builds resolve them too."""

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

SOURCES = {
    "bf16_conv": (Path(__file__).parent / "bf16_conv.c", ["-mavx512f", "-mavx512bf16"]),
    # one source, two builds: GCC vector extensions at 16 lanes (AVX-512) and 8 (AVX2); 256-bit loads unsplit
    "attention_avx512": (Path(__file__).parent / "attention.c", ["-mavx512f", "-mno-avx256-split-unaligned-load"]),
    "attention_avx2": (
        Path(__file__).parent / "attention.c",
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
        Path(__file__).parent / "attention.c",
        ["-mavx512f", "-mavx512bf16", "-DKILN_BF16", "-DKILN_ATTENTION=kiln_attention_bf16"],
    ),
    "bf16_matmul": (Path(__file__).parent / "bf16_matmul.c", ["-mavx512f", "-mavx512bw", "-mavx512bf16"]),
    "amx_bf16_conv": (
        Path(__file__).parent / "amx_bf16_conv.c",
        ["-mavx512f", "-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"],
    ),
}
FLAGS = ["-O3", "-fPIC"]


@functools.cache
def build(name: str) -> tuple[str, str]:
    """(object file, shared library) of a kernel, cached by source digest in a per-user folder."""
    src, arch = SOURCES[name]
    cc = shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    if cc is None:
        raise CompileError(
            f"the {name} kernel needs a C compiler and none is installed",
            where="bf16",
            fix="install gcc, or compile with --precision fp32",
        )
    headers = b"".join(h.read_bytes() for h in sorted(src.parent.glob("*.h")))  # what the sources include
    digest = hashlib.sha256(src.read_bytes() + headers + " ".join(FLAGS + arch).encode()).hexdigest()[:16]
    root = kernel_cache()
    root.mkdir(parents=True, exist_ok=True)
    obj, so = root / f"{name}-{digest}.o", root / f"{name}-{digest}.so"
    if not so.exists():
        with tempfile.TemporaryDirectory(
            dir=root
        ) as tmp:  # build beside, rename into place: concurrent compiles are safe
            t_obj, t_so = Path(tmp) / obj.name, Path(tmp) / so.name
            for cmd in (
                [cc, *FLAGS, *arch, "-c", str(src), "-o", str(t_obj)],
                [cc, "-shared", str(t_obj), "-o", str(t_so)],
            ):
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode:
                    raise CompileError(
                        f"compiling the {name} kernel failed: "
                        f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}",
                        where=str(src),
                        fix="check that the C compiler supports -mavx512bf16 (gcc 10+), or use --precision fp32",
                    )
            os.replace(t_obj, obj)
            os.replace(t_so, so)
    ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)  # in-process JIT builds resolve the symbol here
    return str(obj), str(so)
