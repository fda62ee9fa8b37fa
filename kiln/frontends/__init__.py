"""Model import: ONNX file -> checked, shape-pinned, simplified ONNX -> Relax IRModule.

The names below load on first use, so that importing one frontend module (kiln.frontends.pytorch's
torch.export step, in a process whose TVM has no compiler library: kiln/_compile_elsewhere.py) does
not import TVM's compiler through the ONNX importer."""

import importlib

_WHERE = {
    "ImportedModel": ".importer",
    "import_onnx": ".importer",
    "load_onnx": ".onnx_load",
    "find_unsupported_ops": ".preflight",
    "InputShape": ".shapes",
    "parse_input_shapes": ".shapes",
}


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name], __name__), name)


__all__ = list(_WHERE)
