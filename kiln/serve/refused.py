"""A request the server will not serve, raised anywhere between the request line and the answer; each
protocol (V1, V2 over HTTP, V2 over gRPC) renders it as its own error body."""

from __future__ import annotations


class Refused(Exception):
    """Its HTTP status and why; retry: the client should come back (503, with Retry-After)."""

    def __init__(self, status: int, message: str, retry: bool = False):
        super().__init__(message)
        self.status, self.message, self.retry = status, message, retry

    @property
    def headers(self) -> dict | None:
        return {"Retry-After": "1"} if self.retry else None
