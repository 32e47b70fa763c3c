"""One HTTP request as the front (mcpd.serving.http) parses it: its head, and its body as it
arrives, read only as far as a handler asks for it (mcpd.serving.limits.Bodies does, with the
limits).

A body whose Content-Length is known is received into one buffer of that size once a handler has
asked for it, and the kernel writes the rest of it there directly (`space`): the tensors a request
carries are views of that buffer (numpy.frombuffer in mcpd.serving.codec), never copied again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from mcpd.serving.errors import RequestError

if TYPE_CHECKING:
    from mcpd.serving.http import HttpProtocol

UNCLAIMED_BYTES = 256 * 1024
"""Body bytes kept before a handler asks for the body (it does in its first step, or never):
reading pauses beyond, so a client cannot make the server hold a body nobody takes. The handler's
first step runs before the connection is read again, so one read (asyncio reads at most 256 KiB at
once) stays under this: pausing and resuming cost two epoll_ctl calls (4 % of the event loop in a
profile with 64 KiB here)."""


class BodyTooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class BodyTimeout(Exception):
    pass


class Request:
    """One request: its head, parsed, and its body as it arrives."""

    __slots__ = (
        "_error",
        "_limit",
        "_waiter",
        "body_bytes",
        "claimed",
        "complete",
        "content_length",
        "continue_",
        "discard",
        "headers",
        "keep_alive",
        "method",
        "params",
        "path",
        "protocol",
        "size",
        "sized",
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
        self.size = 0
        """Body bytes received so far (dropped ones too)."""
        self.sized = False
        """body_bytes has the body's whole size, filled up to `size`."""
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
        self.protocol.resume("unclaimed")
        if self._error is not None:
            raise self._error
        if self.size > limit:
            raise BodyTooLarge(self.size)
        if self.complete:
            return self.body_bytes
        if self.content_length is not None:
            # Within the limits and the budget: the rest goes straight into its place.
            whole = bytearray(self.content_length)
            whole[: self.size] = self.body_bytes
            self.body_bytes, self.sized = whole, True
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        if self.continue_:
            self.protocol.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        timer = loop.call_later(timeout_s, self._fail, BodyTimeout())
        try:
            await self._waiter
        finally:
            timer.cancel()
            self._waiter = None
        return self.body_bytes

    @property
    def left(self) -> int:
        """Bytes of a Content-Length body still to come."""
        return (self.content_length or 0) - self.size

    def space(self) -> memoryview | None:
        """Where the rest of the body goes, when it can be received in place."""
        if self.sized and not self.discard:
            return memoryview(self.body_bytes)[self.size :]
        return None

    def filled(self, size: int) -> None:
        """`size` bytes were received into `space()`."""
        self.size += size

    def received(self, data: bytes | memoryview) -> None:
        size = self.size + len(data)
        if self.discard:
            self.size = size
            return
        if self.sized:
            self.body_bytes[self.size : size] = data
        else:
            self.body_bytes += data
        self.size = size
        if not self.claimed:
            if size > UNCLAIMED_BYTES:
                self.protocol.pause("unclaimed")
        elif size > self._limit:
            self._fail(BodyTooLarge(size))

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
