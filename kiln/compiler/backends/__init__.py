"""Targets as backends: one module per target kind (cpu, cuda, vta, and null: everything but code
generation), each a `Backend` (base.py) supplying its pipeline rows per stage, build flow, code
generation and export, tuner, tuning-record selection and manifest section. `backend_for(target)` is
asked once, when the options are made (CompileOptions.make), and the options carry the answer down;
only the driver, the tuning driver, the options and the backends themselves import this package
(tests/test_layers.py)."""

from __future__ import annotations

from ...target import Kind
from .base import Backend, ManifestSection
from .cpu import CPU
from .cuda import CUDA
from .null import NULL
from .vta import VTA

BACKENDS: dict[str, Backend] = {b.kind: b for b in (CPU, CUDA, VTA, NULL)}

__all__ = ["BACKENDS", "BY_TARGET_KIND", "Backend", "ManifestSection", "backend_for"]


BY_TARGET_KIND: dict[Kind, Backend] = {b.target_kind: b for b in (CPU, CUDA, VTA)}


def backend_for(target) -> Backend:
    """The backend that compiles for this parsed Target: the one whose target_kind is its kind."""
    return BY_TARGET_KIND[target.kind]
