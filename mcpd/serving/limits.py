"""What clients together may take from the daemon besides connections (connections.py): memory for
request bodies and unsent answers, and log lines.

The bodies held at once are bounded (the serving process's memory is the board's), and repeated
log lines from asyncio, the HTTP server and the connection cap are throttled (a connection flood
used to log each failed accept: 133 MB of journal in 50 s, issue 11).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from mcpd.config import DaemonSection
from mcpd.serving.errors import RequestError
from mcpd.serving.request import BodyTimeout, BodyTooLarge, Request
from sensors.episodes import Repeats

THROTTLED_LOGGERS = ("asyncio", "mcpd.serving.http", "mcpd.serving.connections")
LOG_INTERVAL_S = 10.0


class Throttle(logging.Filter):
    """Per logger: each message (its first line) at most once per interval, and at most
    `per_logger` records per interval in all (messages that embed varying text cannot get round
    the first rule). The next record that passes says how many were dropped."""

    def __init__(
        self,
        interval_s: float = LOG_INTERVAL_S,
        per_logger: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.clock = clock
        self._lines: Repeats[tuple[str, str]] = Repeats(interval_s)
        self._loggers: Repeats[str] = Repeats(interval_s, times=per_logger)
        self._dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        line = (record.name, str(record.msg).split("\n", 1)[0][:80])
        # A line dropped for its logger's allowance was not said: it may pass once that returns.
        if self._lines.quiet(line, now) or self._loggers.say(record.name, now) is None:
            self._dropped[record.name] = self._dropped.get(record.name, 0) + 1
            return False
        self._lines.say(line, now)
        dropped = self._dropped.pop(record.name, 0)
        if dropped:
            record.msg = f"{record.msg} ({dropped} similar lines dropped before this one)"
        return True

    def install(self) -> None:
        for name in THROTTLED_LOGGERS:
            logging.getLogger(name).addFilter(self)

    def remove(self) -> None:
        for name in THROTTLED_LOGGERS:
            logging.getLogger(name).removeFilter(self)


JSON_ADVICE = (
    "; send big tensors as binary data (Inference-Header-Content-Length) or in shared memory"
)


class Bodies:
    """Request bodies: each within its limit, all those held at once within max_inflight_bytes,
    each received within body_timeout_ms. Answers that wait for their clients to read them are held
    here too (mcpd.serving.http), so clients that do not read take from the same budget."""

    def __init__(self, daemon: DaemonSection) -> None:
        self.daemon = daemon
        self.held = 0

    @contextlib.asynccontextmanager
    async def read(
        self, request: Request, limit: int, setting: str, advice: str = ""
    ) -> AsyncIterator[bytearray]:
        """The body, held against the budget until the block ends (the request's arrays view it)."""
        size = request.content_length
        if size is not None and size > limit:
            raise _too_large(size, limit, setting, advice)
        # A chunked body's size is known only at its end: it holds its limit meanwhile.
        held = limit if size is None else size
        self._take(held)
        try:
            try:
                body = await request.body(limit, self.daemon.body_timeout_ms / 1000)
            except BodyTooLarge as exc:
                raise _too_large(exc.size, limit, setting, advice) from None
            except BodyTimeout:
                raise RequestError(
                    f"the request body did not arrive within {self.daemon.body_timeout_ms} ms "
                    "([daemon] body_timeout_ms)",
                    408,
                ) from None
            yield body
        finally:
            self.held -= held

    def hold_unsent(self, change: int) -> None:
        """The bytes of answers not yet sent changed by `change`."""
        self.held += change

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


def _too_large(size: int, limit: int, setting: str, advice: str = "") -> RequestError:
    return RequestError(
        f"request body of {size} bytes over the limit of {limit} bytes ([daemon] {setting}){advice}",
        413,
    )
