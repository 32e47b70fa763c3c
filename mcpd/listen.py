"""The listening sockets: the Unix socket, handed over by systemd (LISTEN_FDS) or bound at the
configured path, and optional TCP listeners (`[serving] http`) bound from HOST:PORT.

A bound Unix socket is created under a temporary name, given mode 0660 and its group, and only then
renamed into place, so no client ever sees it with looser permissions (a chmod after bind would
leave a window).

A TCP listener has no such gate: every local user can connect to it, and with a non-loopback
address every host that can route to it. `tcp_address` parses and classifies the address so the
configuration can refuse a non-loopback one unless it is explicitly allowed.
"""

from __future__ import annotations

import grp
import ipaddress
import logging
import os
import socket
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("mcpd.listen")

SD_LISTEN_FDS_START = 3
_UCRED = struct.Struct("3i")
"""struct ucred: pid, uid, gid."""


class SocketError(Exception):
    pass


@dataclass(frozen=True)
class Listener:
    sock: socket.socket
    path: str | None
    """The path we bound (and remove on stop); None for a socket systemd owns."""


def passed_by_systemd() -> bool:
    """Whether systemd socket activation passed this process a socket (LISTEN_PID, LISTEN_FDS)."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return False
    count = os.environ.get("LISTEN_FDS", "0")
    return count.isascii() and count.isdigit() and int(count) >= 1


def from_systemd() -> socket.socket | None:
    """The first socket passed by systemd socket activation, if it was passed to this process."""
    if not passed_by_systemd():
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
    occupant = listener_at(path)
    if occupant is not None:
        raise SocketError(f"{occupant} is already serving on {path}")
    os.unlink(path)


@dataclass(frozen=True)
class Occupant:
    """A live listener on a Unix socket."""

    pid: int | None
    """The process that listens (SO_PEERCRED: the one that called listen(2), pid 1 for a socket
    systemd holds); None when its backlog is full and no connection could be made."""

    def __str__(self) -> str:
        return f"another process ({'pid ' + str(self.pid) if self.pid else 'its backlog full'})"


def listener_at(path: str) -> Occupant | None:
    """Who listens on the Unix socket at `path`; None when nothing answers (no socket there, or
    one left by a process that is gone). Never waits: a blocking connect to a listener whose
    backlog is full sleeps until it has room, so the probe is non-blocking, and a full backlog
    (EAGAIN) is a live listener."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    try:
        probe.connect(path)
        credentials = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except BlockingIOError:
        return Occupant(None)
    except OSError:  # ECONNREFUSED: nobody listens any more
        return None
    finally:
        probe.close()
    pid, _, _ = _UCRED.unpack(credentials)
    return Occupant(pid or None)


def listen(path: str, group: str) -> Listener:
    sock = from_systemd()
    if sock is not None:
        log.info("serving on the socket passed by systemd (%s)", sock.getsockname() or "unnamed")
        return Listener(sock, None)
    return Listener(bind(path, group), path)


LOCALHOST = "localhost"
"""The one host name taken, as 127.0.0.1 (binding resolves no names: /etc/hosts may say anything)."""


@dataclass(frozen=True)
class TcpAddress:
    host: str
    """An IP address literal (IPv6 without brackets)."""
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def tcp_address(text: str) -> TcpAddress:
    """HOST:PORT with HOST an IPv4 address, [IPv6] or localhost, and PORT 1..65535; ValueError
    naming what is wrong otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not host:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8000)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: an IPv6 address goes in brackets, e.g. [::1]:8000")
    if host == LOCALHOST:
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"{text!r}: {host!r} is not an IP address (host names other than localhost are not "
            "resolved)"
        ) from None
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return TcpAddress(str(address), int(port))


def bind_tcp(address: TcpAddress, key: str) -> socket.socket:
    """A listening TCP socket on `address`; `key` names the setting in the error. SO_REUSEADDR, so
    a restarted daemon binds again while its previous connections sit in TIME_WAIT."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # [::] means IPv6 only, as the address says
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address.host, address.port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise SocketError(f"cannot listen on {address} ({key}): {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def bind_tcp_listeners(wanted: Mapping[str, tuple[str, str]]) -> dict[str, socket.socket]:
    """A listening socket per role, from its (HOST:PORT, the key that sets it); if one cannot be
    bound, those bound before it are closed again."""
    bound: dict[str, socket.socket] = {}
    try:
        for role, (text, key) in wanted.items():
            bound[role] = bind_tcp(tcp_address(text), key)
    except BaseException:
        for sock in bound.values():
            sock.close()
        raise
    return bound
