"""Default schedules for the kernels of a model (no tuning needed), chosen by a registry keyed
by target family and kernel kind."""

from .apply import ApplyDefaultSchedules, ApplyTuningDatabase
from .registry import RULES, classify

__all__ = ["ApplyDefaultSchedules", "ApplyTuningDatabase", "RULES", "classify"]
