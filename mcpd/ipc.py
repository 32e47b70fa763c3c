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
  object per message, at most MESSAGE_BYTES:
    governor -> serving  {"kind": "config", "config": {...}, "slots": {"model": 0, ...}}
                         (at start and at every reload: the whole configuration, already validated)
    serving -> governor  {"kind": "ready"}                       (listening, models loading)
                         {"kind": "event", "event": {"kind", "message", "data", "ts"}}
                         {"kind": "stats", "models": {"name": {ModelStats fields}}}  (once a second;
                         `statistics` is null: Triton's counts stay in the serving process)

A model keeps its slot for the governor's lifetime, so a reload never makes the batcher read
another model's size.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

from mcpd.status import StatusDocument

MAGIC = b"MCPDIPC1"
SLOTS = 256
STATUS_BYTES = 256 * 1024
MESSAGE_BYTES = 256 * 1024
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
    socket's buffer is dropped and counted (the governor must never wait on serving)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.dropped = 0

    @staticmethod
    def pair() -> tuple[Channel, socket.socket]:
        """The governor's end, and the serving end to hand to the child."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return Channel(ours), theirs

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Mapping[str, Any]) -> bool:
        data = json.dumps(message, separators=(",", ":")).encode()
        if len(data) > MESSAGE_BYTES:
            raise IpcError(f"a {message.get('kind')} message of {len(data)} bytes is too big")
        try:
            self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            self.dropped += 1
            return False
        except OSError:  # the other side is gone; the supervisor sees it exit
            return False
        return True

    def receive(self) -> list[dict[str, Any]] | None:
        """Every message waiting now; None once the other side has closed its end."""
        messages: list[dict[str, Any]] = []
        while True:
            try:
                data = self.sock.recv(MESSAGE_BYTES)
            except (BlockingIOError, InterruptedError):
                return messages
            except OSError:
                return None
            if not data:
                return None
            try:
                message = json.loads(data)
            except ValueError:
                continue  # never from our own peer; ignore rather than die
            if isinstance(message, dict):
                messages.append(message)

    def close(self) -> None:
        self.sock.close()
