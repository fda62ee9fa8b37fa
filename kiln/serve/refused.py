"""A request the server will not serve, raised anywhere between the request line and the answer; each
protocol (V1, V2 over HTTP, V2 over gRPC) renders it as its own error body."""

from __future__ import annotations

import functools
import json


class Refused(Exception):
    """Its HTTP status and why; retry: the client should come back (503, with Retry-After)."""

    def __init__(self, status: int, message: str, retry: bool = False):
        super().__init__(message)
        self.status, self.message, self.retry = status, message, retry
        self.version: str | None = None  # the model version it was meant for, once chosen (for /metrics)

    @property
    def headers(self) -> dict | None:
        return {"Retry-After": "1"} if self.retry else None


@functools.lru_cache(maxsize=256)
def error_body(message: str, status: int | None = None) -> bytes:
    """`{"error": message}` (V1 adds the status), encoded once: under overload the same 503 goes out
    thousands of times a second, and every microsecond of refusing is taken from the model."""
    doc = {"error": message} if status is None else {"error": message, "status": status}
    return json.dumps(doc).encode()
