"""What clients together may take from the daemon: connections (each a file descriptor), memory for
request bodies, and log lines.

The governor shares the process: a client flood that used up every descriptor made every cap write
fail, and asyncio then logged each failed accept (issue 11). So the connection cap stays below the
descriptor limit by a reserve, a connection over the cap is answered 503 and closed at once, the
bodies held at once are bounded, and repeated log lines from asyncio, aiohttp and the cap are
throttled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from mcpd.config import DaemonSection
from mcpd.serving.errors import RequestError
from mcpd.serving.shm import MAX_REGIONS

log = logging.getLogger("mcpd.serving.limits")

ACCEPT_BACKLOG = 64
"""The listen backlog, which is also how many connections asyncio accepts at a time before any of
them reaches the cap (BaseSelectorEventLoop._accept_connection)."""
RESERVED_DESCRIPTORS = 128 + MAX_REGIONS + 2 * ACCEPT_BACKLOG
"""Kept free of connections: the governor's sensor and cap files, the state and spool files, the
MQTT and udev sockets, model files while they load; one per shared memory region; and two batches
of accepted connections not yet refused (a refused one is closed on the next loop iteration)."""
THROTTLED_LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.access", log.name)
LOG_INTERVAL_S = 10.0


def connection_cap(configured: int, descriptors: int | None = None) -> int:
    """`[daemon] max_connections`, lowered to fit the soft descriptor limit less the reserve."""
    if descriptors is None:
        descriptors = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if descriptors == resource.RLIM_INFINITY:
        return configured
    fitting = max(1, descriptors - RESERVED_DESCRIPTORS)
    if fitting < configured:
        log.warning(
            "serving at most %d connections, not max_connections = %d: the descriptor limit is "
            "%d (LimitNOFILE=) and %d stay reserved for the governor and the daemon's own files",
            fitting, configured, descriptors, RESERVED_DESCRIPTORS,
        )  # fmt: skip
    return min(configured, fitting)


class Throttle(logging.Filter):
    """Lets one record per message (its first line) through per interval; the next one that
    passes says how many were dropped."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        super().__init__()
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._dropped: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg).split("\n", 1)[0][:200])
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped:
            record.msg = f"{record.msg} ({dropped} more like this in the last {now - last:.0f} s)"  # type: ignore[operator]
        return True

    def install(self) -> None:
        for name in THROTTLED_LOGGERS:
            logging.getLogger(name).addFilter(self)

    def remove(self) -> None:
        for name in THROTTLED_LOGGERS:
            logging.getLogger(name).removeFilter(self)


class ConnectionCap:
    """A protocol factory in front of aiohttp's: at most `cap()` connections at once; one more is
    answered 503 and closed, so its descriptor is back at once."""

    def __init__(self, inner: Callable[[], asyncio.BaseProtocol], cap: Callable[[], int]) -> None:
        self.inner = inner
        self.cap = cap
        self.open = 0
        self.refused = 0

    def __call__(self) -> asyncio.BaseProtocol:
        cap = self.cap()
        if self.open >= cap:
            self.refused += 1
            log.warning(
                "connection refused: %d client connections are open, the cap is %d "
                "([daemon] max_connections, descriptor limit)", self.open, cap,
            )  # fmt: skip
            return _Refusal(cap)
        self.open += 1
        return _Counted(self.inner(), self)


class _Counted(asyncio.Protocol):
    """aiohttp's protocol, counted until its connection is lost."""

    def __init__(self, inner: asyncio.BaseProtocol, cap: ConnectionCap) -> None:
        self.inner = inner
        self.owner = cap

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[attr-defined,no-any-return]

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.open -= 1
        self.inner.connection_lost(exc)


class _Refusal(asyncio.Protocol):
    def __init__(self, cap: int) -> None:
        self.cap = cap

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        message = f"too many connections: mcpd serves at most {self.cap} at once; retry later"
        body = json.dumps({"error": message}).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(head.encode() + body)
        transport.close()  # after the answer is written; what the client sent is never read


JSON_ADVICE = (
    "; send big tensors as binary data (Inference-Header-Content-Length) or in shared memory"
)


class Bodies:
    """Request bodies: each within its limit, all those held at once within max_inflight_bytes,
    each received within body_timeout_ms."""

    def __init__(self, daemon: DaemonSection) -> None:
        self.daemon = daemon
        self.held = 0

    @contextlib.asynccontextmanager
    async def read(
        self, request: web.Request, limit: int, setting: str, advice: str = ""
    ) -> AsyncIterator[bytearray]:
        """The body, held against the budget until the block ends (the request's arrays view it)."""
        size = request.content_length
        if size is not None and size > limit:
            raise _too_large(size, limit, setting, advice)
        # A chunked body's size is known only at its end: it holds its limit meanwhile.
        held = limit if size is None else size
        self._take(held)
        try:
            timeout = self.daemon.body_timeout_ms / 1000
            try:
                body = await asyncio.wait_for(_read(request, limit, setting, advice), timeout)
            except asyncio.TimeoutError:
                raise RequestError(
                    f"the request body did not arrive within {self.daemon.body_timeout_ms} ms "
                    "([daemon] body_timeout_ms)",
                    408,
                ) from None
            yield body
        finally:
            self.held -= held

    def _take(self, size: int) -> None:
        limit = self.daemon.max_inflight_bytes
        if size > limit:
            raise _too_large(size, limit, "max_inflight_bytes, all requests together")
        if self.held + size > limit:
            raise RequestError(
                f"busy: requests in flight hold {self.held} of the {limit} bytes allowed "
                "([daemon] max_inflight_bytes); retry",
                503,
            )
        self.held += size


async def _read(request: web.Request, limit: int, setting: str, advice: str) -> bytearray:
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise _too_large(len(body), limit, setting, advice)
    return body  # not bytes(body): that would hold it twice


def _too_large(size: int, limit: int, setting: str, advice: str = "") -> RequestError:
    return RequestError(
        f"request body of {size} bytes over the limit of {limit} bytes ([daemon] {setting}){advice}",
        413,
    )
