"""Kiln: an ahead-of-time deep-learning compiler on Apache TVM.

    import kiln
    kiln.compile("model.onnx", "model.kiln", input_shapes=["input:1x3x224x224"])
    m = kiln.load("model.kiln")
    outs = m.run({"input": x})

`kiln.load` and the runtime never import the compiler (nor TVM's compiler library)."""

__version__ = "0.1.0"

from ._tvm_without_torch import install as _hide_torch_from_tvm

_hide_torch_from_tvm()  # before anything imports TVM: seconds less per process where torch is installed

from .runtime.hostinfo import raise_thread_pool_cap  # noqa: E402

raise_thread_pool_cap()  # before anything starts TVM's thread pool

# after raise_thread_pool_cap() on purpose: importing the rest may start TVM's thread pool
from .errors import (  # noqa: E402
    AcceleratorError,
    AccuracyError,
    ArtifactError,
    CompileError,
    IncompatibleArtifactError,
    InputError,
    KilnError,
    MissingExtraError,
    ModelLoadError,
    OptionsError,
    ResourceError,
    ShapeError,
    TargetError,
    UnsupportedModelError,
)
from .runtime import load  # noqa: E402


def compile(model, output, *, example_inputs=None, dynamic_shapes=None, **kwargs):
    """Compile a model to a .kiln artifact; see kiln.compiler.compile_model. `model` is an .onnx,
    .pt2 or .tflite path, an onnx.ModelProto, a torch.export.ExportedProgram, or a torch.nn.Module
    traced here by torch.export with example_inputs= (and dynamic_shapes=, as torch.export takes them;
    pin the dynamic dims with input_shapes= or shape_buckets=, as for any model)."""
    from ._compile_elsewhere import compile_in_child, runtime_only_tvm

    if runtime_only_tvm():  # kiln.load came first in this process: TVM's compiler cannot load here now
        return compile_in_child(model, output, example_inputs, dynamic_shapes, kwargs)
    from .compiler import compile_model

    if example_inputs is not None or dynamic_shapes is not None:
        from .frontends.pytorch import export_module

        model = export_module(model, example_inputs, dynamic_shapes)
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
    "MissingExtraError",
    "ModelLoadError",
    "OptionsError",
    "ResourceError",
    "ShapeError",
    "TargetError",
    "UnsupportedModelError",
    "__version__",
]
