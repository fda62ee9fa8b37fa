"""The null backend (tinygrad's NULL device): everything a CPU compile does but code generation. The
model is imported, optimized by the CPU's rows, its memory planned, its weights stored and its manifest
written; no library is generated, so the artifact is not runnable (its device, "null", is one the
runtime refuses). A test compiles a model with it: whatever the driver needs from a backend is this
interface, nothing else."""

from __future__ import annotations

from .base import ManifestSection
from .cpu import CPUBackend


class NullBackend(CPUBackend):
    kind = "null"
    target_kind = None  # no target string selects it: a test hands it to the options
    device = "null"

    def build(self, mod, options, where: str):
        return None

    def export(self, exe, options, where: str, mod) -> bytes:
        return b""

    def tune(self, model, compile_options, opts, progress, start) -> dict:
        from ...errors import OptionsError

        raise OptionsError("the null backend generates no code to tune", where="kiln tune", fix="tune a real target")

    def manifest_section(self, options, members: dict) -> ManifestSection:
        return ManifestSection(self.device, [])


NULL = NullBackend()
