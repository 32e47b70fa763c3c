"""Client connections: each holds a file descriptor, and the governor shares the process.

1 100 clients that sent half a header used to take every descriptor, and then every cap write
failed (issue 11). So connections are accepted here, not by asyncio's server: only while fewer than
the cap are open, and the cap stays below the descriptor limit by a reserve for the daemon's own
files. At the cap the daemon stops accepting: new clients wait in the socket's backlog (their
connect blocks or, when the backlog is full too, fails) until a connection closes, which the header
timeout guarantees within header_timeout_ms. Waiting clients cost the daemon nothing, where
accepting and refusing each one cost the event loop (and the control loop's interpreter time) as
much as the clients cared to reconnect (BENCHMARKS.md, hostile clients).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from collections.abc import Callable, Sequence

from mcpd.serving.shm import MAX_REGIONS

log = logging.getLogger("mcpd.serving.connections")

RESERVED_DESCRIPTORS = 128 + MAX_REGIONS
"""Kept free of connections: the governor's sensor and cap files, the state and spool files, the
MQTT and udev sockets, model files while they load; and one per shared memory region."""
SOCKET_CAP = "[daemon] max_connections, within the descriptor limit"
"""What sets the socket's cap, for the log line at the cap."""
ACCEPT_RETRY_S = 1.0
"""After accept() itself fails (EMFILE, ENFILE, ENOBUFS: the system, not a client), as asyncio
does."""


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
            fitting,
            configured,
            descriptors,
            RESERVED_DESCRIPTORS,
        )
    return min(configured, fitting)


class Acceptor:
    """Accepts connections on the listening sockets (the Unix socket, the `[serving] http` listener)
    for `factory` (mcpd.serving.http's server) while fewer than `cap()` are open on all of them
    together; `cap_name` says in the log what sets the cap."""

    def __init__(
        self,
        socks: Sequence[socket.socket],
        factory: Callable[[], asyncio.BaseProtocol],
        cap: Callable[[], int],
        cap_name: str = SOCKET_CAP,
    ) -> None:
        self.socks = tuple(socks)
        self.cap_name = cap_name
        self.factory = factory
        self.cap = cap
        self.open = 0
        self.capped = 0
        """Times the cap was reached."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False
        self._stopped = False
        self._connecting: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._resume()

    def stop(self) -> None:
        """Stop accepting; open connections are the HTTP server's to finish."""
        self._stopped = True
        self._pause()

    def _resume(self) -> None:
        if self._loop is not None and not self._accepting and not self._stopped:
            for sock in self.socks:
                self._loop.add_reader(sock.fileno(), self._accept, sock)
            self._accepting = True

    def _pause(self) -> None:
        if self._loop is not None and self._accepting:
            for sock in self.socks:
                self._loop.remove_reader(sock.fileno())
            self._accepting = False

    def _accept(self, sock: socket.socket) -> None:
        assert self._loop is not None
        while self.open < self.cap():
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("cannot accept connections: %s; retrying in %g s", exc, ACCEPT_RETRY_S)
                self._pause()
                self._loop.call_later(ACCEPT_RETRY_S, self._resume)
                return
            conn.setblocking(False)
            if conn.family != socket.AF_UNIX:
                # A response goes out in more than one write: without this, Nagle holds the
                # second until the client's delayed ACK (up to 40 ms on Linux). asyncio sets it
                # only when the socket says IPPROTO_TCP, which one made with protocol 0 does not.
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.open += 1
            task = self._loop.create_task(self._connect(conn))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)
        self.capped += 1
        log.warning(
            "%d client connections are open, the cap (%s): new connections wait until one closes",
            self.open,
            self.cap_name,
        )
        self._pause()

    async def _connect(self, conn: socket.socket) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(lambda: _counted(self.factory(), self), conn)
        except OSError:
            conn.close()
            self.closed()

    def closed(self) -> None:
        self.open -= 1
        self._resume()


class _Counted(asyncio.Protocol):
    """The HTTP protocol, counted until its connection is lost."""

    def __init__(self, inner: asyncio.BaseProtocol, acceptor: Acceptor) -> None:
        self.inner = inner
        self.acceptor = acceptor

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
        self.acceptor.closed()
        self.inner.connection_lost(exc)


class _CountedBuffered(_Counted, asyncio.BufferedProtocol):
    """The same, for a protocol that receives into its own buffer."""

    inner: asyncio.BufferedProtocol

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.inner.get_buffer(sizehint)  # type: ignore[return-value]

    def buffer_updated(self, nbytes: int) -> None:
        self.inner.buffer_updated(nbytes)


def _counted(inner: asyncio.BaseProtocol, acceptor: Acceptor) -> _Counted:
    if isinstance(inner, asyncio.BufferedProtocol):
        return _CountedBuffered(inner, acceptor)
    return _Counted(inner, acceptor)
