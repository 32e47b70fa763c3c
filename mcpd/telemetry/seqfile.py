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

from mcpd.telemetry import journal
from sensors.sysfs import open_regular

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
        fd = open_regular(path, follow_symlinks=False)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} unusable ({journal.describe(exc)})"
    try:
        text = os.read(fd, 64).decode("ascii", errors="replace")
    except OSError as exc:
        return None, f"{path} unreadable ({exc.strerror})"
    finally:
        os.close(fd)
    head = text.split(" ", 1)[0]
    if head.isascii() and head.isdigit() and len(head) < 20 and text.encode() == _record(int(head)):
        return int(head), None
    return None, f"{path} is damaged"
