"""Kiln's accelerators, each a device model (configuration, ISA, simulator, runtime) and a leaf: it
imports nothing of the compiler. The compiler's backends (kiln/compiler/backends/) build for them; the
runtime finds one through the manifest's accelerator kind (`runtime_for`). vta/: a simulated
VTA-compatible FPGA accelerator."""

from __future__ import annotations

KINDS = ("vta-sim",)  # the accelerator kinds a manifest may name


def runtime_for(kind):
    """The runtime module of the accelerator `kind` (its MEMBERS, BACKENDS and `register`), or None."""
    if kind == "vta-sim":
        from .vta import runtime

        return runtime
    return None
