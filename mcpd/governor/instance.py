"""One daemon per set of folders: a second `mcpd run` exits before it touches anything.

Issue 26: a second `mcpd run` on the same config adopted the domains, failed on the socket, then
"restored": the first daemon's caps jumped 816 -> 2 208 MHz for 0.7-1.6 s on a hot board, and both
baseline copies vanished for about a second. So before the baseline is read (reading sets bad copies
aside), before the simulator is built and before any domain is touched, `mcpd run`

- takes an exclusive flock(2) on the runtime and state folders themselves, without waiting. A lock
  on the folder needs no lock file that root's `mcpd restore`, a planted link or a file of the
  wrong owner could get in the way of; the kernel drops it when the process dies (kill -9, a
  watchdog kill), so no stale lock ever blocks the next start or ExecStopPost's restore. The
  descriptors are close-on-exec: the serving process never holds it;
- asks the socket (unless systemd passed it, and then it is systemd's): a listener that answers is
  another instance, whose folders may differ;
- only then writes its pid to `mcpd.pid` in each folder, which the second instance names. The pid
  file is only a name: whether an instance runs is the lock's word, never the file's.

`mcpd restore` takes the same locks (creating nothing): while a daemon governs, the baseline is its
own, and it restores the caps itself when it stops.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

import safefs
from mcpd.config import DaemonSection
from mcpd.listen import listener_at

log = logging.getLogger("mcpd.governor.instance")

PID_FILE = "mcpd.pid"
_PID_LIMIT = 32


class AlreadyRunning(Exception):
    """Another instance holds a folder or answers on the socket; the message names it."""


class InstanceLock:
    """Exclusive locks on folders, held until release() (or the process's death)."""

    def __init__(self) -> None:
        self._held: dict[Path, int] = {}
        """Folder -> its locked descriptor."""

    def take(self, folder: Path, *, create: bool, mode: int) -> None:
        """Lock `folder` (created with `mode` when asked; an absent one is skipped otherwise).
        Raises AlreadyRunning naming the holder. A folder that cannot be opened or locked (a
        planted link, no permission) is logged and skipped: it costs the guard, never the
        governing (the baseline's own reading says what is wrong with it)."""
        try:
            fd = safefs.open_folder(folder, create=create, mode=mode)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot lock %s (%s); a second instance is not kept out", folder, exc)
            return
        if _identity(fd) in {_identity(held) for held in self._held.values()}:
            os.close(fd)  # one folder by two names: flock would conflict with our own lock
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _pid_in(fd)
            os.close(fd)
            if exc.errno != errno.EWOULDBLOCK:
                log.warning("cannot lock %s (%s); a second instance is not kept out", folder, exc)
                return
            raise AlreadyRunning(
                f"another mcpd (pid {holder or 'unknown'}) holds {folder}"
            ) from None
        self._held[folder] = fd

    def write_pid(self) -> None:
        """Name this process in each folder; a folder that cannot take it loses only the name."""
        for fd in self._held.values():
            with contextlib.suppress(OSError):
                safefs.write_file(fd, PID_FILE, f"{os.getpid()}\n".encode())

    def release(self, *, remove_pid: bool = False) -> None:
        for fd in self._held.values():
            if remove_pid and _pid_in(fd) == os.getpid():
                with contextlib.suppress(OSError):
                    safefs.remove(fd, PID_FILE)
            os.close(fd)  # drops the lock
        self._held = {}

    def __enter__(self) -> InstanceLock:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release(remove_pid=True)


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _pid_in(folder: int) -> int | None:
    try:
        data = safefs.read_file(folder, PID_FILE, _PID_LIMIT)
    except OSError:
        return None
    text = (data or b"").decode("ascii", "replace").strip()
    return int(text) if text.isdigit() and text.isascii() else None


def claim(daemon: DaemonSection, *, socket_passed: bool) -> InstanceLock:
    """The folders of `daemon`, locked and named with this pid; raises AlreadyRunning (nothing
    taken) when another instance holds one of them or answers on its socket."""
    lock = InstanceLock()
    try:
        lock.take(Path(daemon.runtime_dir), create=True, mode=0o755)
        lock.take(Path(daemon.state_dir), create=True, mode=0o750)
        occupant = None if socket_passed else listener_at(daemon.socket)
        if occupant is not None:
            raise AlreadyRunning(f"{occupant} is serving on {daemon.socket}")
    except BaseException:
        lock.release()
        raise
    lock.write_pid()
    return lock


def hold(folders: Iterable[str | Path]) -> InstanceLock:
    """The existing ones of `folders`, locked without creating or writing anything (`mcpd
    restore`, as root). Raises AlreadyRunning when a daemon holds one."""
    lock = InstanceLock()
    try:
        for folder in folders:
            lock.take(Path(folder), create=False, mode=0o755)
    except BaseException:
        lock.release()
        raise
    return lock
