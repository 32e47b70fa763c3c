"""`mcpd reload`: a reload that waits for the daemon's verdict, for systemd's ExecReload.

`kill -HUP` returns before the daemon has read the file, so `systemctl reload` reported success for a
config the daemon then rejected. Here the daemon, after each reload, writes its verdict to
`reload-verdict.json` in its `[daemon] runtime_dir` (atomically, through safefs), stamped with
its pid and the CLOCK_MONOTONIC time at which that reload *began*, before it read the config. `mcpd reload` notes the monotonic time, sends SIGHUP, and waits for a verdict of that
pid that began after that time: only a reload that began after the signal can have read the file
as it is now, so neither an older verdict nor one of a reload already under way is mistaken for
the answer (CLOCK_MONOTONIC is one clock for every process of a boot, which is also how systemd's
own RELOADING=1 + MONOTONIC_USEC handshake tells reloads apart; sd_notify(3)). Several signals
that arrive during one reload are answered by the next one, which reads the newest file.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import safefs

log = logging.getLogger("mcpd")

VERDICT_FILE = "reload-verdict.json"
_MAX_VERDICT_BYTES = 65536


@dataclass(frozen=True)
class Verdict:
    pid: int
    began: float
    """CLOCK_MONOTONIC seconds when the reload began, before the config was read."""
    ok: bool
    message: str


def write(folder: Path, verdict: Verdict) -> None:
    """Publish a verdict; a failure is logged, never raised (the reload itself has happened)."""
    try:
        fd = safefs.open_folder(folder, create=True, mode=0o755)
        try:
            safefs.write_file(fd, VERDICT_FILE, json.dumps(asdict(verdict)).encode())
        finally:
            os.close(fd)
    except OSError as exc:
        log.error("reload: cannot write the verdict to %s (%s)", folder, exc.strerror or exc)


def read(folder: Path) -> Verdict | None:
    """The newest verdict, or None when there is none or it is not one."""
    try:
        fd = safefs.open_folder(folder)
        try:
            fields = safefs.read_json(fd, VERDICT_FILE, _MAX_VERDICT_BYTES)
        finally:
            os.close(fd)
        if not isinstance(fields, dict):
            return None
        return Verdict(
            int(fields["pid"]), float(fields["began"]), bool(fields["ok"]), str(fields["message"])
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None


class NoDaemon(Exception):
    """The process to reload does not exist (or is not ours to signal)."""


def request(
    pid: int,
    folder: Path,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Verdict | None:
    """Signal the daemon to reload and wait for its verdict on it; None after `timeout_s`."""
    asked = clock()
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        raise NoDaemon(f"cannot signal process {pid}: {exc.strerror}") from None
    deadline = asked + timeout_s
    while clock() < deadline:
        verdict = read(folder)
        if verdict is not None and verdict.pid == pid and verdict.began > asked:
            return verdict
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise NoDaemon(f"process {pid} ended before it answered") from None
        sleep(0.05)
    return None
