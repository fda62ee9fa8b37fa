"""Kiln: an ahead-of-time deep-learning compiler on Apache TVM.

    import kiln
    kiln.compile("model.onnx", "model.kiln", input_shapes=["input:1x3x224x224"])
    m = kiln.load("model.kiln")
    outs = m.run({"input": x})

`kiln.load` and the runtime never import the compiler (nor TVM's compiler library)."""

__version__ = "0.1.0"

from .runtime.hostinfo import raise_thread_pool_cap

raise_thread_pool_cap()  # before anything starts TVM's thread pool

from .errors import (
    AcceleratorError,
    AccuracyError,
    ArtifactError,
    CompileError,
    IncompatibleArtifactError,
    InputError,
    KilnError,
    ModelLoadError,
    OptionsError,
    ResourceError,
    ShapeError,
    TargetError,
    UnsupportedModelError,
)
from .runtime import load  # noqa: E402


def compile(model, output, **kwargs):
    """Compile an ONNX model to a .kiln artifact; see kiln.compiler.compile_model."""
    from .compiler import compile_model

    return compile_model(model, output, **kwargs)


__all__ = [
    "compile",
    "load",
    "KilnError",
    "AcceleratorError",
    "AccuracyError",
    "ArtifactError",
    "CompileError",
    "IncompatibleArtifactError",
    "InputError",
    "ModelLoadError",
    "OptionsError",
    "ResourceError",
    "ShapeError",
    "TargetError",
    "UnsupportedModelError",
    "__version__",
]
