"""The spool's file: an append-only journal of self-delimiting frames, compacted by atomic rewrite.

Layout: the magic `MCPDSPL2`, then frames of `marker (4 bytes A5 5A C3 3C) | type (1) | body length
(4) | CRC-32 of type, length and body (4) | body`, big-endian:

- ADD  (1): message id (8), kind (1: 0 telemetry, 1 an event of no known kind (and any event in a
  file from before event kinds were kept), 2 and up an event of mcpd.events.KINDS in order), payload
- DONE (2): message ids (8 each) delivered or dropped since they were added
- SEQ  (3): the next telemetry `seq` (8), reserved ahead so that it never goes back after a crash

Replaying the frames in order gives the messages still owed to the broker. A damaged frame (a torn
tail after a power cut, bit rot, a flipped length) costs that frame only: the reader looks for the
next marker whose frame checks out and carries on from there (a stray marker inside a payload
fails the checksum). The file is read in chunks of `CHUNK` bytes, so a large spool is never held
whole. A damaged file is set aside as `<name>.corrupt` (one, the newest) for a person to look at
and a fresh file is written; a file that is not a regular file (a FIFO, a symlink, a device) is
never read, so it cannot block the publisher. Appends are one `write()` per batch and reach the
page cache at once, so a daemon crash loses nothing; `fsync` is the caller's choice (see Spool).
Rewrites are atomic (safefs: a fresh O_EXCL temporary, so nothing planted is written through,
fsync, rename, fsync of the folder).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import safefs
from mcpd import events
from safefs import open_regular

log = logging.getLogger("mcpd.telemetry")

Kind = Literal["telemetry", "event"]
OTHER = "other"
"""The share of events of a kind mcpd does not make (the serving process may send any)."""
SHARES = ("telemetry", OTHER, *events.KINDS)
"""What messages share the spool's room by; an ADD frame's kind byte is the index here."""
MAGIC = b"MCPDSPL2"
MARKER = b"\xa5\x5a\xc3\x3c"
ADD, DONE, SEQ = 1, 2, 3
_HEAD = struct.Struct(">4sBII")
_CHECKED = struct.Struct(">BI")
_ADD = struct.Struct(">QB")
_ID = struct.Struct(">Q")
MAX_BODY = 4 * 2**20
"""No message is this large (a telemetry document is a few KiB); a longer frame is damage."""
CHUNK = 2**20


@dataclass(frozen=True)
class Message:
    id: int
    kind: Kind
    payload: bytes
    event: str = OTHER
    """An event's kind: one of mcpd.events.KINDS, or OTHER."""

    @property
    def share(self) -> str:
        """Whose room in the spool it takes: telemetry's, or that of events of its kind."""
        return "telemetry" if self.kind == "telemetry" else self.event


def frame(kind: int, body: bytes) -> bytes:
    if len(body) > MAX_BODY:
        raise ValueError(f"frame body of {len(body)} bytes exceeds {MAX_BODY}")
    checked = _CHECKED.pack(kind, len(body))
    return MARKER + checked + zlib.crc32(body, zlib.crc32(checked)).to_bytes(4, "big") + body


def add_frame(message: Message) -> bytes:
    return frame(ADD, _ADD.pack(message.id, SHARES.index(message.share)) + message.payload)


def done_frame(ids: Iterable[int]) -> bytes:
    return frame(DONE, b"".join(_ID.pack(i) for i in ids))


def seq_frame(seq: int) -> bytes:
    return frame(SEQ, _ID.pack(seq))


def parse_add(body: bytes) -> Message:
    if len(body) < _ADD.size:
        raise ValueError("short ADD frame")
    ident, share_index = _ADD.unpack_from(body)
    if share_index >= len(SHARES):
        raise ValueError(f"unknown message kind {share_index}")
    if share_index == 0:
        return Message(ident, "telemetry", body[_ADD.size :])
    return Message(ident, "event", body[_ADD.size :], SHARES[share_index])


def parse_ids(body: bytes) -> list[int]:
    if len(body) % _ID.size:
        raise ValueError("DONE frame of a broken length")
    return [ident for (ident,) in _ID.iter_unpack(body)]


def parse_seq(body: bytes) -> int:
    if len(body) != _ID.size:
        raise ValueError("SEQ frame of a broken length")
    return int(_ID.unpack(body)[0])


class Damage:
    """What a reader skipped: how many damaged regions, and the first one's offset and reason."""

    def __init__(self) -> None:
        self.regions = 0
        self.first: str | None = None
        self._inside = False

    def note(self, offset: int, reason: str) -> None:
        if not self._inside:
            self.regions += 1
            self.first = self.first or f"{reason} at byte {offset}"
        self._inside = True

    def good(self) -> None:
        self._inside = False

    def __str__(self) -> str:
        more = f" and {self.regions - 1} more damaged regions" if self.regions > 1 else ""
        return f"{self.first}{more}"


def read_frames(read: Callable[[int], bytes], damage: Damage) -> Iterator[tuple[int, int, bytes]]:
    """(offset, type, body) of every frame that checks out, streaming through `read`."""
    buf = bytearray()
    base = pos = 0  # file offset of buf[0]; position in buf
    eof = False

    def fill(size: int) -> bool:
        nonlocal eof
        while len(buf) < size and not eof:
            chunk = read(CHUNK)
            eof = not chunk
            buf.extend(chunk)
        return len(buf) >= size

    if not fill(len(MAGIC)) or buf[: len(MAGIC)] != MAGIC:
        damage.note(0, "not a spool file (bad magic)")
        return
    pos = len(MAGIC)
    while True:
        if pos >= CHUNK:  # keep the buffer about one chunk long
            del buf[:pos]
            base, pos = base + pos, 0
        if not fill(pos + 1):
            return
        problem = _check(buf, pos, fill)
        if problem is None:
            length = _HEAD.unpack_from(buf, pos)[2]
            yield base + pos, buf[pos + 4], bytes(buf[pos + _HEAD.size : pos + _HEAD.size + length])
            damage.good()
            pos += _HEAD.size + length
            continue
        damage.note(base + pos, problem)
        while (found := buf.find(MARKER, pos + 1)) < 0:  # resynchronise at the next marker
            keep = max(pos + 1, len(buf) - len(MARKER) + 1)
            del buf[:keep]
            base, pos = base + keep, -1
            if not fill(len(buf) + 1):
                return
        pos = found


def _check(buf: bytearray, pos: int, fill: Callable[[int], bool]) -> str | None:
    """Why the frame at `pos` is not one, or None when it checks out (then it is in `buf`)."""
    if not fill(pos + _HEAD.size):
        return "truncated frame header"
    marker, _, length, crc = _HEAD.unpack_from(buf, pos)
    if marker != MARKER:
        return "no frame marker"
    if length > MAX_BODY:
        return "impossible frame length"
    if not fill(pos + _HEAD.size + length):
        return "truncated frame"
    body = memoryview(buf)[pos + _HEAD.size : pos + _HEAD.size + length]
    try:
        if zlib.crc32(body, zlib.crc32(buf[pos + 4 : pos + 9])) != crc:
            return "checksum mismatch"
    finally:
        body.release()
    return None


def describe(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link, not a file"
    return exc.strerror or str(exc)


def load(path: Path, apply: Callable[[int, bytes], None]) -> bool:
    """Stream the frames an earlier run left at `path` into `apply(type, body)` (which raises
    ValueError for a frame it cannot use). A damaged or foreign file is set aside, with a log line.
    True when there was a file."""
    damage = Damage()
    try:
        fd = open_regular(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as exc:
        damage.note(0, describe(exc))
    else:
        try:
            for offset, kind, body in read_frames(lambda size: os.read(fd, size), damage):
                try:
                    apply(kind, body)
                except ValueError as exc:
                    damage.note(offset, str(exc))
                    damage.good()
        except OSError as exc:
            damage.note(-1, f"read error ({exc.strerror})")
        finally:
            os.close(fd)
    if damage.regions:
        aside = path.with_name(f"{path.name}.corrupt")
        log.warning(
            "telemetry spool %s is damaged (%s); kept every message that checked out and set the "
            "file aside as %s",
            path,
            damage,
            aside.name,
        )
        os.replace(path, aside)
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def replace_atomically(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all (safefs: a fresh O_EXCL name renamed over it, so a
    file or link planted in the folder is never written through)."""
    folder = safefs.open_folder(path.parent)
    try:
        safefs.write_file(folder, path.name, data, mode=0o600)
    finally:
        os.close(folder)


class Journal:
    """Owned by one thread. Every method may raise OSError; the spool decides what that means."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending = bytearray()
        self._fd: int | None = None
        self.unsynced = False

    def append(self, data: bytes) -> None:
        self._pending += data

    def flush(self) -> None:
        """Hand the appended frames to the kernel: from here a crash of the daemon loses nothing."""
        if not self._pending:
            return
        if self._fd is None:
            append = os.O_WRONLY | os.O_APPEND
            self._fd = open_regular(self.path, follow_symlinks=False, access=append)
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
        replace_atomically(self.path, MAGIC + seq_frame(seq) + b"".join(map(add_frame, messages)))
        self.unsynced = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
