"""Read an ONNX file (with external weight files) into a ModelProto, or fail with ModelLoadError."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx import numpy_helper

from ..errors import ModelLoadError

FIX = "check that the file is a complete .onnx model (re-export it, or re-download it)"


def load_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError("no such model file", where=str(path), fix="give the path of an existing .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError and friends: truncated or not ONNX at all
        raise ModelLoadError(f"not a readable ONNX model ({type(e).__name__}: {e})", where=str(path), fix=FIX) from None
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError("the file holds no ONNX graph (empty or not an ONNX model)", where=str(path), fix=FIX)
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as e:
        raise ModelLoadError(
            f"cannot read the model's external weight data: {e}",
            where=str(path),
            fix="keep the external data files beside the .onnx file, with the names it references",
        ) from None
    check_onnx(model, str(path))
    return model


def check_onnx(model: onnx.ModelProto, where: str) -> None:
    """ONNX's own checker, its failures (any of them) as ModelLoadError."""
    try:
        if model.ByteSize() < 2**31 - 1:
            onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        if "of 'type' is required but missing" in str(e):
            return  # undeclared output shapes: onnxruntime runs such models, and so do we
        first = str(e).strip().splitlines()[0]
        raise ModelLoadError(f"invalid ONNX model: {first}", where=where, fix=FIX) from None
    except Exception as e:  # the checker itself failing on damaged strings, etc.
        raise ModelLoadError(f"invalid ONNX model ({type(e).__name__}: {str(e)[:200]})", where=where, fix=FIX) from None


def to_array(init: onnx.TensorProto, where: str):
    """An initializer as numpy, or a ModelLoadError naming it when its data does not match its dims."""
    try:
        return numpy_helper.to_array(init)
    except Exception as e:
        raise ModelLoadError(
            f"initializer {init.name!r} (dims {list(init.dims)}) does not hold matching data "
            f"({type(e).__name__}: {str(e)[:120]})",
            where=where,
            fix=FIX,
        ) from None
