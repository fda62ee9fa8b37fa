"""Kiln's own Relax passes, one per file."""
from .lift_weights import LiftWeights

__all__ = ["LiftWeights"]
