"""The listening socket: handed over by systemd (LISTEN_FDS), or bound at the configured path.

A bound socket is created under a temporary name, given mode 0660 and its group, and only then
renamed into place, so no client ever sees it with looser permissions (a chmod after bind would
leave a window).
"""

from __future__ import annotations

import grp
import logging
import os
import socket
import stat
from dataclasses import dataclass

log = logging.getLogger("mcpd.listen")

SD_LISTEN_FDS_START = 3


class SocketError(Exception):
    pass


@dataclass(frozen=True)
class Listener:
    sock: socket.socket
    path: str | None
    """The path we bound (and remove on stop); None for a socket systemd owns."""


def from_systemd() -> socket.socket | None:
    """The first socket passed by systemd socket activation, if it was passed to this process."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    if count < 1:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # so that child processes do not take them too
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise SocketError(f"the socket passed by systemd is not a Unix stream socket: {sock}")
    sock.setblocking(False)
    return sock


def bind(path: str, group: str) -> socket.socket:
    gid = -1
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise SocketError(f"socket_group {group!r} does not exist") from None
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, mode=0o755, exist_ok=True)
    _remove_stale(path)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        sock.bind(temporary)
        os.chmod(temporary, 0o660)
        if gid != -1:
            os.chown(temporary, -1, gid)
        sock.listen(128)
        os.rename(temporary, path)
    except OSError as exc:
        sock.close()
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise SocketError(f"cannot listen on {path}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def _remove_stale(path: str) -> None:
    """A socket file left by a crashed run is removed; a live one (another mcpd) or anything that
    is not a socket is an error."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise SocketError(f"another process is already serving on {path}")


def listen(path: str, group: str) -> Listener:
    sock = from_systemd()
    if sock is not None:
        log.info("serving on the socket passed by systemd (%s)", sock.getsockname() or "unnamed")
        return Listener(sock, None)
    return Listener(bind(path, group), path)
