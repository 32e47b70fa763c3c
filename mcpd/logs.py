"""Log lines on stderr, with journald priority prefixes when stderr is the journal.

Under systemd, stderr is a stream to journald, which stores every line at the unit's default
priority unless the line starts with `<N>`, the syslog priority (sd-daemon(3)); then `journalctl
-p err` finds errors. systemd says that stderr is its stream by setting $JOURNAL_STREAM to the
stream's `device:inode` (systemd.exec(5)); anywhere else (a terminal, a pipe, a file, or a child
that inherited the variable but not the stream) the lines are left as they are. No timestamps:
journald adds its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TextIO

FORMAT = "%(levelname)s %(name)s: %(message)s"
# syslog(3) priorities, as sd-daemon(3) SD_ERR etc.
_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6}
_DEBUG = 7


class JournalFormatter(logging.Formatter):
    """Every line of a record (a traceback too) carries its priority: journald stores each line
    of a stream as an entry of its own."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{_PRIORITY.get(record.levelno, _DEBUG)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


def to_journal(environ: Mapping[str, str], stream: TextIO) -> bool:
    """True when `stream` is the journal stream that $JOURNAL_STREAM names."""
    device, _, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        found = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    return (found.st_dev, found.st_ino) == (int(device), int(inode))


def setup(level: str, environ: Mapping[str, str], stream: TextIO) -> None:
    handler = logging.StreamHandler(stream)
    journal = to_journal(environ, stream)
    handler.setFormatter(JournalFormatter(FORMAT) if journal else logging.Formatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
