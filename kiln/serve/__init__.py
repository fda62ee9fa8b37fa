"""`kiln serve`: dynamic batching server over the runtime (never the compiler): V1 routes and the Open
Inference Protocol (KServe V2) over HTTP and gRPC."""

from .options import ServeOptions

__all__ = ["ServeOptions"]
