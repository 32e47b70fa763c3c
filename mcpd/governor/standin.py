"""While the serving process is down between crash-loop restarts, the governor answers its socket.

Only then: during an ordinary restart connections wait in the listening socket's backlog for the new
serving process (which starts at once). But a serving process that keeps crashing is restarted with
a growing delay, and clients must not hang meanwhile: status and liveness are answered from the
governor's own status document, everything else with 503, a Retry-After and the reason. On the
`[metrics] listen` port, which serves only /metrics, a scrape gets that 503 too (Prometheus counts
the scrape as failed: `up` is 0): the exposition is the serving process's, since prometheus_client
would cost the governor a quarter of its memory (docs/metrics.md §4).

Deliberately minimal, because it runs in the governor: one request per connection, its head read
without blocking up to HEAD_BYTES, request line only, `Connection: close`; whatever follows (a body)
is read and dropped until the client closes or HEAD_S has passed since it connected; at most
MAX_CONNECTIONS at once (the oldest is dropped).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Sequence

from mcpd.status import StatusDocument

HEAD_BYTES = 8192
HEAD_S = 2.0
MAX_CONNECTIONS = 64
STATUS_CACHE_S = 0.2
"""How long one status document answers every status request: a flood of them during a crash loop
had the governor build it for each, at its real-time priority (78 % of a core)."""


class StandIn:
    TICK_S = 0.5
    """How often connections are looked at for their deadline."""

    def __init__(
        self,
        listeners: Sequence[socket.socket],
        status: Callable[[], StatusDocument],
        reason: Callable[[], tuple[str, float]],
        clock: Callable[[], float],
        *,
        metrics: socket.socket | None = None,
    ) -> None:
        self.listeners = {listener.fileno(): listener for listener in listeners}
        """The Unix socket, and the `[serving] http` listener where there is one."""
        self._metrics = None if metrics is None else metrics.fileno()
        """The `[metrics] listen` port, where there is one."""
        if metrics is not None:
            self.listeners[metrics.fileno()] = metrics
        self.status = status
        self.reason = reason
        """Why serving is down, and in how many seconds it is started again."""
        self.clock = clock
        self._connections: dict[int, tuple[socket.socket, bytearray, float]] = {}
        self._answered: set[int] = set()
        self._scrapes: set[int] = set()
        """Connections to the metrics port."""
        self._status_body = b""
        self._status_until = float("-inf")

    def fds(self) -> list[int]:
        return [*self.listeners, *self._connections]

    def ready(self, fd: int) -> None:
        if fd in self.listeners:
            self._accept(self.listeners[fd])
        elif fd in self._connections:
            self._read(fd)

    def expire(self) -> None:
        now = self.clock()
        for fd in [fd for fd, (_, _, deadline) in self._connections.items() if deadline <= now]:
            self._drop(fd)

    def close(self) -> None:
        for fd in list(self._connections):
            self._drop(fd)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors and the like: the backlog keeps them
                return
            connection.setblocking(False)
            if len(self._connections) >= MAX_CONNECTIONS:
                self._drop(next(iter(self._connections)))
            self._connections[connection.fileno()] = (
                connection,
                bytearray(),
                self.clock() + HEAD_S,
            )
            if listener.fileno() == self._metrics:
                self._scrapes.add(connection.fileno())

    def _read(self, fd: int) -> None:
        connection, head, _ = self._connections[fd]
        try:
            data = connection.recv(HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(fd)
            return
        if fd in self._answered:
            return  # the body of a request already answered: read and forgotten
        head += data
        if b"\r\n\r\n" not in head and len(head) < HEAD_BYTES:
            return
        line = bytes(head).split(b"\r\n", 1)[0].split()
        method, path = (line[0], line[1]) if len(line) >= 2 else (b"", b"")
        status, body, extra = self._answer(method, path.split(b"?", 1)[0], fd in self._scrapes)
        reply = (
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
        ).encode() + body
        with contextlib.suppress(OSError):  # small: fits a fresh connection's socket buffer
            connection.send(reply)
            # Read what the client still sends (a request body) until it closes or the deadline,
            # so that it is not cut off by a reset before it reads the answer.
            connection.shutdown(socket.SHUT_WR)
        self._answered.add(fd)

    def _answer(self, method: bytes, path: bytes, scrape: bool) -> tuple[str, bytes, str]:
        why, retry_s = self.reason()
        if scrape and (method, path) != (b"GET", b"/metrics"):
            return (
                "404 Not Found",
                json.dumps({"error": "this port serves only GET /metrics"}).encode(),
                "",
            )
        if not scrape and method == b"GET" and path == b"/v2/mcpd/status":
            return "200 OK", self._status(), ""
        if not scrape and method == b"GET" and path == b"/v2/health/live":
            return "200 OK", b"", ""
        retry = f"Retry-After: {max(1, round(retry_s))}\r\n"
        message = f"serving is restarting: {why}; retry in {retry_s:.0f} s"
        return "503 Service Unavailable", json.dumps({"error": message}).encode(), retry

    def _status(self) -> bytes:
        now = self.clock()
        if now >= self._status_until:
            self._status_body = json.dumps(self.status()).encode()
            self._status_until = now + STATUS_CACHE_S
        return self._status_body

    def _drop(self, fd: int) -> None:
        connection, _, _ = self._connections.pop(fd)
        self._answered.discard(fd)
        self._scrapes.discard(fd)
        connection.close()
