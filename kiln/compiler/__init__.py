"""The compiler: options, the pass pipeline as data, and build (ONNX -> .kiln)."""

from .build import CompileResult, compile_model
from .options import CompileOptions

__all__ = ["CompileOptions", "CompileResult", "compile_model"]
