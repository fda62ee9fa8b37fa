"""Export: a TVM executable as the bytes of a shared library, linked with Kiln's C kernels and (for CPU
targets) the runtime's thread pool, cross-compiled where the target's arch is not the host's. The
backends' `export` (kiln/compiler/backends/base.py) calls it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..errors import CompileError
from ..runtime import artifact as art
from ..runtime.hostinfo import host_arch
from ..schedules.kernels import C_KERNEL_ATTR

CROSS_COMPILERS = {"aarch64": "aarch64-linux-gnu-g++"}
POOL_SOURCE = str(Path(art.__file__).with_name("pool.c"))  # the runtime's thread pool, linked into CPU libraries


def c_kernels(mod, arch: str | None = None) -> list[str]:
    """Object files of Kiln's C kernels the module calls, built for `arch` (None: the host's), to link into its
    library."""
    from .passes.bf16_conv_kernel import ConvGeometry, kernel_source

    sources = {kernel_source(f.attrs) for f in mod.functions.values() if ConvGeometry.of(f.attrs) is not None} | {
        str(f.attrs[C_KERNEL_ATTR]) for f in mod.functions.values() if f.attrs is not None and C_KERNEL_ATTR in f.attrs
    }
    if not sources:
        return []
    from ..schedules.kernels import build

    return [build(s, arch)[0] for s in sorted(sources)]


def export_library(exe, arch: str, where: str, objects: list[str] = (), pool: bool = True) -> bytes:
    """The executable as a shared library, linked with Kiln's C kernels (`objects`) and, for CPU
    targets (`pool`), the runtime's thread pool (kiln/runtime/pool.c, compiled for the target's arch)."""
    from tvm.support import cc as tvm_cc

    extra = [*objects, *([POOL_SOURCE] if pool else [])]
    flags = ["-O2", "-pthread"]
    kwargs = {}
    if arch != host_arch():
        cc = CROSS_COMPILERS.get(arch)
        if cc is None or shutil.which(cc) is None:
            raise CompileError(
                f"cross-compiling for {arch} needs the linker {cc or '?'}, which is not installed",
                where=where,
                fix="apt-get install g++-aarch64-linux-gnu (or compile on the target machine)",
            )
        kwargs["fcompile"] = tvm_cc.cross_compiler(cc, options=flags, add_files=extra or None)
    elif extra:

        def fcompile(output, files, options=None, **kw):
            return tvm_cc.create_shared(output, list(files) + extra, options=[*(options or []), *flags], **kw)

        fcompile.output_format = "so"
        kwargs["fcompile"] = fcompile
    with tempfile.TemporaryDirectory(prefix="kiln-build-") as tmp:
        lib = Path(tmp) / art.LIBRARY
        exe.export_library(str(lib), **kwargs)
        return lib.read_bytes()
