"""The socket pair between the governor and the serving process, one end each; mcpd.ipc says what
crosses it.

SOCK_SEQPACKET: message boundaries kept, ordered, reliable. A message of up to INLINE_BYTES is one
datagram; a larger one (the configuration of a few hundred models, their statistics) is written to
a sealed memfd that crosses with a one-byte datagram (SCM_RIGHTS), up to MESSAGE_BYTES, so that no
message is too big for the socket's buffer. Each end takes only a sealed memfd, which no one can
change or make block while it is read, of at most its limit. What arrives and is not a message
(mcpd.ipc.decode) is refused: logged, and never handed on.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Callable

from mcpd.ipc import IpcError, Message, MessageError, decode, encode
from sensors.episodes import Repeats

log = logging.getLogger("mcpd.ipc")

INLINE_BYTES = 32 * 1024
"""The largest message sent as a datagram: far below any socket's send buffer (a datagram over
it is refused with EMSGSIZE; net.core.wmem_default is 208 KiB, a configuration of 450 models
205 KB, and a board may set it lower)."""
MESSAGE_BYTES = 64 * 2**20
"""The largest message at all, in a memfd: above what any configuration that loads expands to
(a 1 MiB config file of empty governor profiles, the largest expansion found, is 24 MB of JSON)."""
FROM_SERVING_BYTES = 4 * 2**20
"""The largest message the governor reads: the statistics of 256 models are a few hundred KB (their
paths, bounded by the 1 MiB config file, are most of it), and a serving process taken over by a
client must not make the governor hold 64 MB."""
REFUSED_LOG_S = 60.0
"""A peer's malformed messages are said at most this often, with how many more since."""
_IN_MEMFD = b"\0"
"""The datagram that carries a memfd holding the message."""
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK


class Channel:
    """One end of the socket pair. Sending never blocks: a message that does not fit in the
    socket's buffer now is not sent (send returns False and counts it; the governor must never
    wait on serving, and resends a configuration until it is taken)."""

    def __init__(
        self,
        sock: socket.socket,
        limit: int = MESSAGE_BYTES,
        peer: str = "the governor",
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.limit = limit
        """The largest message taken from the other side."""
        self.peer = peer
        self.clock = clock
        self.dropped = 0
        self._refused: Repeats[str] = Repeats(REFUSED_LOG_S)

    @staticmethod
    def pair() -> tuple[Channel, socket.socket]:
        """The governor's end, and the serving end to hand to the child."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return Channel(ours, FROM_SERVING_BYTES, "the serving process"), theirs

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Message) -> bool:
        """True once the message is in the other end's queue; False when the queue is full or the
        other side is gone. Raises IpcError when it cannot be sent at all (over MESSAGE_BYTES, or
        no memfd to be had)."""
        data = encode(message)
        kind = message["kind"]
        if len(data) > MESSAGE_BYTES:
            raise IpcError(
                f"a {kind} message of {len(data)} bytes is too big (at most {MESSAGE_BYTES})"
            )
        memfd = None if len(data) <= INLINE_BYTES else _sealed(data, kind)
        try:
            if memfd is None:
                self.sock.send(data)
            else:
                socket.send_fds(self.sock, [_IN_MEMFD], [memfd])
        except (BlockingIOError, InterruptedError):
            self.dropped += 1
            return False
        except OSError:  # the other side is gone; the supervisor sees it exit
            return False
        finally:
            if memfd is not None:
                os.close(memfd)  # the message in flight holds its own reference
        return True

    def receive(self) -> list[Message] | None:
        """Every message waiting now; None once the other side has closed its end and every message
        it sent before has been read. What is not a message is refused (_refuse) and left out."""
        messages: list[Message] = []
        while True:
            try:
                data, ancillary, flags, _ = self.sock.recvmsg(
                    INLINE_BYTES, socket.CMSG_SPACE(_FD.size), socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                return messages
            except OSError:
                return messages or None  # the end is seen again at the next call
            fds = _received_fds(ancillary)
            if not data and not fds:
                return messages or None
            try:
                if data == _IN_MEMFD and len(fds) == 1 and not flags & socket.MSG_CTRUNC:
                    data = _read_sealed(fds[0], self.limit)
                elif fds or flags & socket.MSG_TRUNC:
                    raise MessageError("descriptors that are not one memfd, or a cut datagram")
                messages.append(decode(data))
            except (OSError, IpcError) as exc:
                self._refuse(exc)
            finally:
                for fd in fds:
                    os.close(fd)

    def close(self) -> None:
        self.sock.close()

    def _refuse(self, why: Exception) -> None:
        """Said at most once every REFUSED_LOG_S, with how many more since: a peer that sends
        nothing but malformed messages must not flood the log."""
        unsaid = self._refused.say(self.peer, self.clock())
        if unsaid is not None:
            more = f" ({unsaid} more since)" if unsaid else ""
            log.warning("refused a message from %s: %s%s", self.peer, why, more)


_FD = struct.Struct("=i")


def _sealed(data: bytes, kind: str) -> int:
    """A memfd holding `data`, sealed so that the reader can trust it never changes or blocks."""
    try:
        fd = os.memfd_create(f"mcpd-{kind}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:
        raise IpcError(
            f"no memfd for a {kind} message of {len(data)} bytes: {exc.strerror}"
        ) from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
    except OSError as exc:
        os.close(fd)
        raise IpcError(
            f"cannot write a {kind} message of {len(data)} bytes: {exc.strerror}"
        ) from None
    return fd


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            whole = len(data) - len(data) % _FD.size
            fds += [fd for (fd,) in _FD.iter_unpack(data[:whole])]
    return fds


def _read_sealed(fd: int, limit: int) -> bytes:
    """The message in a memfd the other process passed; refused (MessageError) unless it is a
    sealed memfd of at most `limit` bytes, which no one can change or make block while it is read
    (a file on a hung FUSE mount would block the governor)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        raise MessageError(f"a descriptor that is not a regular file of at most {limit} bytes")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:  # not a memfd
        seals = 0
    if seals & _SEALS != _SEALS:
        raise MessageError("a memfd that is not sealed")
    data = os.pread(fd, info.st_size, 0)
    if len(data) != info.st_size:
        raise MessageError("a memfd shorter than it says")
    return data
