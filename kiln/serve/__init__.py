"""`kiln serve`: dynamic batching HTTP server over the runtime (never the compiler)."""

from .options import ServeOptions

__all__ = ["ServeOptions"]
