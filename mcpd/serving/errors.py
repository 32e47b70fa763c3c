"""The one error type a request can end in, carrying the HTTP status the protocol maps it to.

Statuses follow Triton's mapping (docs/serving-protocol.md §1.5): 400 bad request (the default), 404
unknown model or region, 413 too large, 503 unavailable (queue full, not ready, timed out, shutting
down), 500 a model that failed while running.
"""

from __future__ import annotations


class RequestError(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class LoadError(Exception):
    """A model that cannot be served; the message says why in one line."""
