"""The one protocol between the governor process and the serving process.

Two channels, each chosen for what crosses it:

- A shared memory block (a memfd the governor creates and both map) for values read on every
  request, with no system call: the batch size per model, and the governor's status document.
  Layout, native byte order:

      magic "MCPDIPC1" (8) | slots u32 | status capacity u32
      batch sizes: slots x i32          (index: the model's slot, see below; 0 = unset)
      status: sequence u64 | length u32 | JSON bytes (status capacity)

  The batch sizes are aligned 4-byte words, which a store writes whole. The status document is
  written under a sequence lock: the sequence is odd while it is being written, and a reader that
  sees it odd, or changed across its read, reads again.

- A socket pair (SOCK_SEQPACKET: message boundaries kept, ordered, reliable) for events, one JSON
  object per message. A message of up to INLINE_BYTES is one datagram; a larger one (the
  configuration of a few hundred models, their statistics) is written to a sealed memfd that
  crosses with a one-byte datagram (SCM_RIGHTS), up to MESSAGE_BYTES:
    governor -> serving  {"kind": "config", "generation": N, "config": {...}, "slots": {...}}
                         (at start and at every reload: the whole configuration, already
                         validated; N counts the configurations the governor has sent)
    serving -> governor  {"kind": "configured", "generation": N, "error": null or "why not"}
                         (the acknowledgement of each configuration; one refused at start ends
                         that serving process, one refused on reload leaves the previous one)
                         {"kind": "ready"}                       (listening, models loading)
                         {"kind": "event", "event": {"kind", "message", "data", "ts"}}
                         {"kind": "stats", "models": {"name": {ModelStats fields}}}  (once a second;
                         `statistics` is null: Triton's counts stay in the serving process)

A model keeps its slot for the governor's lifetime, so a reload never makes the batcher read
another model's size.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import socket
import stat
import struct
from collections.abc import Mapping
from typing import Any

from mcpd.config import MAX_MODELS
from mcpd.status import StatusDocument

MAGIC = b"MCPDIPC1"
SLOTS = MAX_MODELS
STATUS_BYTES = 256 * 1024
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
_IN_MEMFD = b"\0"
"""The datagram that carries a memfd holding the message."""
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
_HEADER = struct.Struct("=8sII")
_BATCH = struct.Struct("=i")
_STATUS_HEAD = struct.Struct("=QI")
_BATCH_AT = _HEADER.size
_STATUS_AT = _BATCH_AT + SLOTS * _BATCH.size
SIZE = _STATUS_AT + _STATUS_HEAD.size + STATUS_BYTES
_STATUS_TRIES = 10_000
"""Reads of a status document before giving up (a writer takes well under a millisecond; a
governor that died half-way leaves the sequence odd for good, and serving must not spin on it)."""
_STATUS_PARSES = 3
"""Copies that do not parse before giving up: a torn copy parses on the next read, and a block
that never does must not cost thousands of parses of up to STATUS_BYTES on serving's loop."""


class IpcError(Exception):
    pass


class SharedBlock:
    """The shared memory block: the governor writes, serving reads."""

    def __init__(self, fd: int, *, create: bool) -> None:
        if create:
            os.ftruncate(fd, SIZE)
        self.fd = fd
        self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED)
        if create:
            _HEADER.pack_into(self._map, 0, MAGIC, SLOTS, STATUS_BYTES)
        elif _HEADER.unpack_from(self._map, 0) != (MAGIC, SLOTS, STATUS_BYTES):
            raise IpcError("the shared block is not this version's")

    @classmethod
    def create(cls) -> SharedBlock:
        return cls(os.memfd_create("mcpd-ipc", os.MFD_CLOEXEC), create=True)

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)

    # -- batch sizes -----------------------------------------------------------------------------

    def set_batch(self, slot: int, size: int) -> None:
        _BATCH.pack_into(self._map, _BATCH_AT + slot * _BATCH.size, size)

    def batch(self, slot: int) -> int:
        return int(_BATCH.unpack_from(self._map, _BATCH_AT + slot * _BATCH.size)[0])

    # -- the status document ---------------------------------------------------------------------

    def set_status(self, document: StatusDocument) -> None:
        """Publish `document`; one too big for the block (thousands of sensors) keeps every key but
        loses its per-sensor, per-domain and per-model parts, so that readers still get the
        contract's shape."""
        data = json.dumps(document, separators=(",", ":")).encode()
        if len(data) > STATUS_BYTES:
            trimmed: StatusDocument = {
                **document,
                "temperatures": {},
                "powers": {},
                "domains": {},
                "inference": {},
            }
            data = json.dumps(trimmed, separators=(",", ":")).encode()
        sequence = _STATUS_HEAD.unpack_from(self._map, _STATUS_AT)[0]
        _STATUS_HEAD.pack_into(self._map, _STATUS_AT, sequence + 1, 0)  # odd: being written
        start = _STATUS_AT + _STATUS_HEAD.size
        self._map[start : start + len(data)] = data
        _STATUS_HEAD.pack_into(self._map, _STATUS_AT, sequence + 2, len(data))

    def status(self) -> StatusDocument | None:
        """The newest status document; None before the first, or if no whole one could be read.
        The governor wrote it with mcpd.status.document (the same version of mcpd: it starts its
        serving process from its own files), so it is the contract's shape, not checked again.

        A copy that does not parse is read again as if the sequence had moved: Python puts no
        memory barrier between the stores of the data and of the sequence, and on the arm64 boards
        mcpd runs on another core may see them in either order."""
        start = _STATUS_AT + _STATUS_HEAD.size
        unparsed = 0
        for _ in range(_STATUS_TRIES):
            before, length = _STATUS_HEAD.unpack_from(self._map, _STATUS_AT)
            if before % 2 or length > STATUS_BYTES:
                continue
            data = bytes(self._map[start : start + length])
            if _STATUS_HEAD.unpack_from(self._map, _STATUS_AT)[0] != before:
                continue
            if not before:
                return None
            try:
                document: StatusDocument = json.loads(data)
            except ValueError:
                unparsed += 1
                if unparsed == _STATUS_PARSES:
                    return None
                continue
            return document
        return None


class Channel:
    """One end of the socket pair. Sending never blocks: a message that does not fit in the
    socket's buffer now is not sent (send returns False and counts it; the governor must never
    wait on serving, and resends a configuration until it is taken)."""

    def __init__(self, sock: socket.socket, limit: int = MESSAGE_BYTES) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.limit = limit
        """The largest message taken from the other side."""
        self.dropped = 0

    @staticmethod
    def pair() -> tuple[Channel, socket.socket]:
        """The governor's end, and the serving end to hand to the child."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return Channel(ours, FROM_SERVING_BYTES), theirs

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Mapping[str, Any]) -> bool:
        """True once the message is in the other end's queue; False when the queue is full or the
        other side is gone. Raises IpcError when it cannot be sent at all (over MESSAGE_BYTES, or
        no memfd to be had)."""
        data = json.dumps(message, separators=(",", ":")).encode()
        kind = message.get("kind")
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

    def receive(self) -> list[dict[str, Any]] | None:
        """Every message waiting now; None once the other side has closed its end."""
        messages: list[dict[str, Any]] = []
        while True:
            try:
                data, ancillary, flags, _ = self.sock.recvmsg(
                    INLINE_BYTES, socket.CMSG_SPACE(_FD.size), socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                return messages
            except OSError:
                return None
            fds = _received_fds(ancillary)
            if not data and not fds:
                return None
            try:
                if data == _IN_MEMFD and len(fds) == 1 and not flags & socket.MSG_CTRUNC:
                    data = _read_sealed(fds[0], self.limit)
                elif fds or flags & socket.MSG_TRUNC:
                    continue  # never from our own peer; ignore rather than die
                message = json.loads(data)
            except (OSError, ValueError):
                continue
            finally:
                for fd in fds:
                    os.close(fd)
            if isinstance(message, dict):
                messages.append(message)

    def close(self) -> None:
        self.sock.close()


_FD = struct.Struct("=i")


def _sealed(data: bytes, kind: object) -> int:
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
    """The message in a memfd the other process passed; refused (ValueError) unless it is a
    sealed memfd of at most `limit` bytes, which no one can change or make block while it is read
    (a file on a hung FUSE mount would block the governor)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        raise ValueError("not a message")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:  # not a memfd
        seals = 0
    if seals & _SEALS != _SEALS:
        raise ValueError("not a sealed memfd")
    data = os.pread(fd, info.st_size, 0)
    if len(data) != info.st_size:
        raise ValueError("a short read")
    return data
