"""The optimized module -> a TVM executable (tvm.compile for the options' target). Its own module
so that the build driver, --layout auto and the calibration builds share it without importing
each other."""

from __future__ import annotations

from ..errors import pass_errors
from .options import CompileOptions


def build_executable(mod, options: CompileOptions, where: str):
    import tvm

    with pass_errors("tvm.compile", where), options.target.tvm():
        return tvm.compile(mod, target=options.target.tvm())
