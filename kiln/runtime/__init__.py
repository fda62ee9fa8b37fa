"""Kiln's runtime: loads a .kiln artifact with TVM's runtime library only. It never imports
kiln.compiler (a test enforces it)."""

from .model import Model, load

__all__ = ["Model", "load"]
