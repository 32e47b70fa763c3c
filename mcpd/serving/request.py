"""One HTTP request as the front (mcpd.serving.http) parses it: its head, and its body as it
arrives, read only as far as a handler asks for it (mcpd.serving.limits.Bodies does, with the
limits)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from mcpd.serving.errors import RequestError

if TYPE_CHECKING:
    from mcpd.serving.http import HttpProtocol

UNCLAIMED_BYTES = 65536
"""Body bytes kept before a handler asks for the body (it does in its first step, or never):
reading pauses beyond, so a client cannot make the server hold a body nobody takes."""


class BodyTooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class BodyTimeout(Exception):
    pass


class Request:
    """One request: its head, parsed, and its body as it arrives."""

    __slots__ = (
        "_error", "_limit", "_waiter", "body_bytes", "claimed", "complete", "content_length", "continue_",
        "discard", "headers", "keep_alive", "method", "params", "path", "protocol",
    )  # fmt: skip

    def __init__(
        self,
        protocol: HttpProtocol,
        method: str,
        path: str,
        headers: dict[str, str],
        keep_alive: bool,
    ) -> None:
        self.protocol = protocol
        self.method = method
        self.path = path
        self.headers = headers
        """Names in lower case."""
        self.keep_alive = keep_alive
        self.params: dict[str, str] = {}
        """The route's path parameters."""
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self.content_length: int | None = None if chunked else int(length or 0)
        """None for a chunked body, whose size is known at its end."""
        self.continue_ = headers.get("expect", "").lower() == "100-continue"
        self.body_bytes = bytearray()
        self.complete = False
        self.claimed = False
        self.discard = False
        self._limit = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.protocol.transport

    async def body(self, limit: int, timeout_s: float) -> bytearray:
        """The whole body: BodyTooLarge as soon as more than `limit` bytes are known to come,
        BodyTimeout if it has not all arrived within `timeout_s`."""
        if self.content_length is not None and self.content_length > limit:
            raise BodyTooLarge(self.content_length)
        self.claimed, self._limit = True, limit
        if self._error is not None:
            raise self._error
        if len(self.body_bytes) > limit:
            raise BodyTooLarge(len(self.body_bytes))
        if self.complete:
            return self.body_bytes
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        if self.continue_:
            self.protocol.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.protocol.resume("unclaimed")
        timer = loop.call_later(timeout_s, self._fail, BodyTimeout())
        try:
            await self._waiter
        finally:
            timer.cancel()
            self._waiter = None
        return self.body_bytes

    def received(self, data: bytes) -> None:
        if self.discard:
            return
        self.body_bytes += data
        if not self.claimed:
            if len(self.body_bytes) > UNCLAIMED_BYTES:
                self.protocol.pause("unclaimed")
        elif len(self.body_bytes) > self._limit:
            self._fail(BodyTooLarge(len(self.body_bytes)))

    def ended(self) -> None:
        self.complete = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def broken(self, message: str) -> None:
        """The body cannot be parsed: whoever reads it gets a 400 that says why."""
        self._fail(RequestError(f"Bad Request: {message}"))

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
