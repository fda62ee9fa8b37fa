"""Default schedules for the kernels of a model (no tuning needed), chosen by a registry keyed
by target family and kernel kind.

The names below are imported on first use (PEP 562), not with the package: `kiln tune`'s build
worker imports kiln.schedules.builder in a fresh process, and the rules' import (the int8 tensor
intrinsics, parsed from TVMScript) would add seconds to every worker start, inside the --budget."""

from importlib import import_module

_LAZY = {
    "ApplyDefaultSchedules": ".apply",
    "ApplyTuningDatabase": ".apply",
    "RULES": ".registry",
    "classify": ".registry",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ApplyDefaultSchedules", "ApplyTuningDatabase", "RULES", "classify"]
