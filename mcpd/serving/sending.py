"""Answers on their way to a client of the HTTP server (mcpd.serving.http), once written to its
connection's transport.

Answers a client does not read wait in the transport's buffer, and closing the connection waits
for them to be sent: a client that sent requests and read nothing held its connection for good,
and enough of them every connection (issue 26). So while answers wait, the client must take some
of them every `timeout_s` ([daemon] send_timeout_ms), else the connection is dropped: the timeout
runs between two writes the kernel accepts, not over a whole answer, as nginx's send_timeout does,
so a slow reader of a large answer keeps its connection. And the bytes the transport keeps unsent
are held against the same max_inflight_bytes as request bodies (mcpd.serving.limits.Bodies), so
clients that do not read cannot pin more memory than clients that send.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mcpd.serving.limits import Bodies

log = logging.getLogger("mcpd.serving.http")  # throttled with the HTTP server's lines


class Sending:
    """One connection's answers, from its transport's write() on."""

    def __init__(self, timeout_s: float, bodies: Bodies, dropped: Callable[[], int]) -> None:
        self.timeout_s = timeout_s
        self.bodies = bodies
        self.dropped = dropped
        """Counts a connection dropped for the timeout; how many so far."""
        self.transport: asyncio.WriteTransport | None = None
        """Set once the connection is made, None again once it is lost."""
        self.written = 0
        """Bytes given to the transport, which sends what the kernel takes and keeps the rest."""
        self.unsent = 0
        """Of those, the bytes it kept when last looked at: held in `bodies`."""
        self._timer: asyncio.TimerHandle | None = None

    def wrote(self, size: int) -> None:
        self.written += size
        self.look()
        if self.unsent and self._timer is None:
            self._expect()

    def look(self) -> None:
        """Hold what the transport keeps unsent (nothing once the connection is lost) in `bodies`:
        looked at after each write, when the transport resumes writing and on each send timeout,
        so up to a high-water mark of bytes already sent may still be held until then."""
        unsent = 0 if self.transport is None else self.transport.get_write_buffer_size()
        self.bodies.hold_unsent(unsent - self.unsent)
        self.unsent = unsent

    def lost(self) -> None:
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
        self.look()

    def _expect(self) -> None:
        """Drop the connection unless the client takes some of what waits within timeout_s."""
        self._timer = asyncio.get_running_loop().call_later(
            self.timeout_s, self._check, self.written - self.unsent
        )

    def _check(self, sent_before: int) -> None:
        self._timer = None
        self.look()
        if self.transport is None or not self.unsent:
            return
        if self.written - self.unsent > sent_before:
            self._expect()
            return
        log.warning(
            "closed a connection whose client took nothing of its answers for %g s "
            "([daemon] send_timeout_ms); %d so far",
            self.timeout_s,
            self.dropped(),
        )
        self.transport.abort()
