"""Model import: ONNX file -> checked, shape-pinned, simplified ONNX -> Relax IRModule."""

from .importer import ImportedModel, import_onnx
from .onnx_load import load_onnx
from .preflight import find_unsupported_ops
from .shapes import InputShape, parse_input_shapes

__all__ = ["ImportedModel", "import_onnx", "load_onnx", "find_unsupported_ops", "InputShape", "parse_input_shapes"]
