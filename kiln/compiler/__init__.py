"""The compiler: options, the pass pipeline as data, and build (ONNX -> .kiln).

The names are imported on first use, so that `kiln.compiler.options` (which the CLI reads to
declare its flags) can be imported without the build driver, the schedules and TVM."""

__all__ = ["CompileOptions", "CompileResult", "compile_model"]


def __getattr__(name: str):
    if name in ("CompileResult", "compile_model"):
        from . import build

        return getattr(build, name)
    if name == "CompileOptions":
        from .options import CompileOptions

        return CompileOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
