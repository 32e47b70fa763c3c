"""The spool's file: an append-only journal of checksummed frames, compacted by atomic rewrite.

Layout: the magic `MCPDSPL1`, then frames of `type (1 byte) | body length (4) | CRC-32 of type and
body (4) | body`, big-endian:

- ADD  (1): message id (8), kind (1: 0 telemetry, 1 event), payload
- DONE (2): message ids (8 each) delivered or dropped since they were added
- SEQ  (3): the next telemetry `seq` (8), reserved ahead so that it never goes back after a crash

Replaying the frames in order gives the messages still owed to the broker. A crash can tear the
last frame (a power cut) and a disk can rot; either way the frames before the damage are kept, the
file is set aside (renamed `*.corrupt-<unix time>`) for a person to look at, and a fresh file is
written. Appends are one `write()` per batch and reach the page cache at once, so a daemon crash
loses nothing; `fsync` is the caller's choice (see Spool). Rewrites are atomic: temporary file,
fsync, rename, fsync of the folder.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger("mcpd.telemetry")

Kind = Literal["telemetry", "event"]
KINDS: tuple[Kind, ...] = ("telemetry", "event")
MAGIC = b"MCPDSPL1"
ADD, DONE, SEQ = 1, 2, 3
_HEAD = struct.Struct(">BII")
_ADD = struct.Struct(">QB")
_ID = struct.Struct(">Q")
_MAX_FRAME = 64 * 2**20


@dataclass(frozen=True)
class Message:
    id: int
    kind: Kind
    payload: bytes


@dataclass(frozen=True)
class Replay:
    messages: dict[int, Message] = field(default_factory=dict)
    """Messages still owed, by id."""
    seq: int = 0
    problem: str | None = None
    """Why the file was not read to its end, with the byte offset; None when it was."""


def frame(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(kind, len(body), zlib.crc32(bytes([kind]) + body)) + body


def add_frame(message: Message) -> bytes:
    return frame(ADD, _ADD.pack(message.id, KINDS.index(message.kind)) + message.payload)


def done_frame(ids: Iterable[int]) -> bytes:
    return frame(DONE, b"".join(_ID.pack(i) for i in ids))


def seq_frame(seq: int) -> bytes:
    return frame(SEQ, _ID.pack(seq))


def _apply(kind: int, body: bytes, messages: dict[int, Message]) -> int | None:
    """Apply one frame; returns the reserved seq for SEQ frames. Raises ValueError if malformed."""
    if kind == ADD and len(body) >= _ADD.size:
        ident, kind_index = _ADD.unpack_from(body)
        if kind_index >= len(KINDS):
            raise ValueError(f"unknown message kind {kind_index}")
        messages[ident] = Message(ident, KINDS[kind_index], body[_ADD.size :])
    elif kind == DONE and len(body) % _ID.size == 0:
        for (ident,) in _ID.iter_unpack(body):
            messages.pop(ident, None)
    elif kind == SEQ and len(body) == _ID.size:
        return int(_ID.unpack(body)[0])
    else:
        raise ValueError(f"malformed frame of type {kind}")
    return None


def replay(data: bytes) -> Replay:
    if not data.startswith(MAGIC):
        return Replay(problem="not a spool file (bad magic) at byte 0")
    messages: dict[int, Message] = {}
    seq, pos, problem = 0, len(MAGIC), None
    while pos < len(data):
        if len(data) - pos < _HEAD.size:
            problem = f"truncated frame header at byte {pos}"
            break
        kind, length, crc = _HEAD.unpack_from(data, pos)
        body = data[pos + _HEAD.size : pos + _HEAD.size + length]
        if length > _MAX_FRAME or len(body) < length:
            problem = f"truncated frame at byte {pos}"
            break
        if zlib.crc32(bytes([kind]) + body) != crc:
            problem = f"checksum mismatch at byte {pos}"
            break
        try:
            reserved = _apply(kind, body, messages)
        except ValueError as exc:
            problem = f"{exc} at byte {pos}"
            break
        if reserved is not None:
            seq = reserved
        pos += _HEAD.size + length
    ordered = dict(sorted(messages.items()))
    return Replay(ordered, seq, problem)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Journal:
    """Owned by one thread. Every method may raise OSError; the spool decides what that means."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending = bytearray()
        self._fd: int | None = None
        self.unsynced = False

    @classmethod
    def open(cls, path: Path) -> tuple[Journal, Replay]:
        """Read what an earlier run left, set a damaged file aside, start a compacted one."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            data = b"\0"  # not our magic: set aside below, if it can be moved at all
            log.error("telemetry spool %s unreadable (%s)", path, exc.strerror)
        result = replay(data) if data else Replay()
        if result.problem:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            log.warning(
                "telemetry spool %s is damaged (%s); kept the %d messages before it and set the "
                "file aside as %s",
                path, result.problem, len(result.messages), aside.name,
            )  # fmt: skip
            os.replace(path, aside)
        journal = cls(path)
        journal.rewrite(result.messages.values(), result.seq)
        return journal, result

    def append(self, data: bytes) -> None:
        self._pending += data

    def flush(self) -> None:
        """Hand the appended frames to the kernel: from here a crash of the daemon loses nothing."""
        if not self._pending:
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        data, self._pending = bytes(self._pending), bytearray()
        _write_all(self._fd, data)
        self.unsynced = True

    def sync(self) -> None:
        """Make the file survive a power cut."""
        self.flush()
        if self._fd is not None and self.unsynced:
            os.fsync(self._fd)
        self.unsynced = False

    def rewrite(self, messages: Iterable[Message], seq: int) -> None:
        """Replace the file with just these messages, atomically."""
        self._pending.clear()
        self.close()
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, MAGIC + seq_frame(seq) + b"".join(add_frame(m) for m in messages))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        folder = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        self.unsynced = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
