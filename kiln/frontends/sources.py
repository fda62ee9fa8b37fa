"""One entry point for every model format: `load_source(model)` reads an .onnx, .pt2 or .tflite
file (detected by content, see detect.py), an onnx.ModelProto or a torch.export program once, and
the Source it returns imports it per shape bucket into the same ImportedModel the Kiln pipeline
takes. The compiler and `kiln inspect` ask nothing else of a format."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..errors import OptionsError
from .detect import FORMATS, detect_format

FRONTENDS = {"onnx": "ONNX (tvm.relax.frontend.onnx)", "pt2": "PyTorch (tvm.relax.frontend.torch)",
             "tflite": "TFLite (tvm.relax.frontend.tflite)"}  # fmt: skip


@dataclasses.dataclass
class Source:
    format: str  # "onnx" | "pt2" | "tflite"
    where: str
    program: object  # onnx.ModelProto | ExportedProgram | tflite.Model
    framework: dict  # {"name", "version", ...}: what wrote the model and what read it
    _cache: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def onnx(self):
        """The ModelProto for the ONNX-only parts of the compile (reproducers, fallback blame), else None."""
        return self.program if self.format == "onnx" else None

    @property
    def frontend(self) -> str:
        return FRONTENDS[self.format]

    def import_bucket(self, shapes, options=None):
        """ImportedModel for one set of pinned input shapes."""
        frozen = options.freeze_inputs if options is not None else ()
        if self.format == "onnx":
            from .importer import import_onnx

            cpu = options is None or options.backend.recurrence_kernel  # the recurrence kernel is CPU code
            return import_onnx(self.program, shapes, self.where, checked=True, frozen=frozen, recurrence_kernel=cpu)
        if frozen:
            raise OptionsError(
                f"--freeze-input works on ONNX models only, not on {FORMATS[self.format]}",
                where="--freeze-input",
                fix="bake the constant into the model before export (a Python constant, or a fixed input)",
            )
        if self.format == "pt2":
            from . import pytorch

            if "decomposed" not in self._cache:
                self._cache["decomposed"] = pytorch.decompose(self.program, self.where)
            return pytorch.import_program(self.program, shapes, self.where, decomposed=self._cache["decomposed"])
        from . import tflite

        return tflite.import_tflite(self.program, shapes, self.where)

    def manifest(self) -> dict:
        """What the artifact's manifest says of its source."""
        return {"format": self.format, "frontend": self.frontend, "framework": self.framework}


def load_source(model) -> Source:
    """A path, an onnx.ModelProto, or a torch.export.ExportedProgram -> Source (read and checked)."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        from .onnx_load import check_onnx

        check_onnx(model, "<model>")
        return Source("onnx", "<model>", model, _onnx_framework(model))
    if not isinstance(model, str | os.PathLike):
        if type(model).__name__ == "ExportedProgram":
            from . import pytorch

            return Source("pt2", "<torch.export program>", model, pytorch.framework())
        raise OptionsError(
            f"cannot compile a {type(model).__name__}",
            where="model",
            fix="give a path (.onnx, .pt2, .tflite), an onnx.ModelProto, a torch.export.ExportedProgram, or an "
            "nn.Module with example_inputs=",
        )
    where = str(model)
    fmt = detect_format(model)
    if fmt == "kiln":
        from ..errors import ModelLoadError

        raise ModelLoadError(
            "this is a compiled Kiln artifact, not a model",
            where=where,
            fix="give the .onnx/.pt2/.tflite it was built from",
        )
    if fmt == "pt2":
        from . import pytorch

        ep, saved_by = pytorch.load_pt2(model)
        return Source("pt2", where, ep, pytorch.framework(saved_by=saved_by))
    if fmt == "tflite":
        from . import tflite

        m = tflite.load_tflite(model)
        return Source("tflite", where, m, tflite.framework(m))
    from .onnx_load import load_onnx

    m = load_onnx(model)
    return Source("onnx", where, m, _onnx_framework(m))


def _onnx_framework(model) -> dict:
    import onnx

    producer = f"{model.producer_name} {model.producer_version}".strip()
    return {"name": "onnx", "version": onnx.__version__, "producer": producer or None, "ir_version": model.ir_version}


def describe(path: str | os.PathLike) -> dict:
    """`kiln inspect` of a model file of any format (the same keys for all, plus `format`/`frontend`)."""
    if detect_format(path) == "onnx":
        from .preflight import inspect_onnx

        return dict(inspect_onnx(path), format="onnx", frontend=FRONTENDS["onnx"])
    src = load_source(Path(path))
    if src.format == "pt2":
        from . import pytorch

        info = pytorch.describe(src.program, str(path), src.framework.get("saved_by"))
    else:
        from . import tflite

        info = tflite.describe(src.program, str(path))
    return dict(info, format=src.format, frontend=src.frontend, framework=src.framework)
