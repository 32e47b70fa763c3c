"""The telemetry `seq` record beside the spool: one line, the number and its CRC-32 in hex.

Replaced atomically (see journal.replace_atomically); read without following a symlink or waiting
on a FIFO. A record that cannot be saved is removed, so that a stale, lower one is never trusted
after a crash (unlink works on a full disk, writing does not): its absence is doubt, and the spool
then jumps forward (see spool.py).
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path

import safefs
from mcpd.telemetry import journal

log = logging.getLogger("mcpd.telemetry")


def _record(seq: int) -> bytes:
    return f"{seq} {zlib.crc32(str(seq).encode()):08x}\n".encode()


def save(path: Path, seq: int) -> None:
    try:
        journal.replace_atomically(path, _record(seq))
    except OSError as exc:
        log.error("telemetry seq: cannot save to %s (%s)", path, exc.strerror)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as gone:
            log.error("telemetry seq: cannot remove %s either (%s)", path, gone.strerror)


def read(path: Path) -> tuple[int | None, str | None]:
    """The saved next seq, or None and why it is in doubt (None, None: no record, no doubt)."""
    try:
        folder = safefs.open_folder(path.parent)
        try:
            data = safefs.read_file(folder, path.name, 64)
        finally:
            os.close(folder)
    except OSError as exc:
        return None, f"{path} unusable ({exc.strerror or exc})"
    if data is None:
        return None, None
    text = data.decode("ascii", errors="replace")
    head = text.split(" ", 1)[0]
    if head.isascii() and head.isdigit() and len(head) < 20 and data == _record(int(head)):
        return int(head), None
    return None, f"{path} is damaged"
