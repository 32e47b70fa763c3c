"""Which user a client connection belongs to, for shared memory (mcpd.serving.shm;
docs/serving-protocol.md §8.1).

On the Unix socket the kernel says so: SO_PEERCRED, the credentials of the process that connected
(unix(7)). A TCP connection has no such option, but a loopback one has both ends on this kernel,
which lists every TCP socket of the network namespace with the uid that created it in
/proc/net/tcp and /proc/net/tcp6 (proc(5); the same column `ss -e` shows): the client's socket is
the established one whose local address is our peer's and whose remote address is ours. The
4-tuple of an established connection is unique in the namespace, so no other socket can stand in
for it while the connection lives, and the uid is the creator's as SO_PEERCRED's is the
connector's. Under the unit's PrivateUsers= both read as the overflow uid for users outside the
namespace, which mcpd.serving.shm refuses alike. A client that is not on loopback (only with
`[serving] allow_remote_http`) has no entry here, hence no uid: it cannot use shared memory, which
is on another host anyway.

Either is fixed for the life of a connection, so it is looked up once per connection and kept
with it (the TCP lookup reads a file; SO_PEERCRED is a system call on every request otherwise).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
import weakref

PROC_NET = "/proc/self/net"
"""The network namespace of this process (/proc/net links here)."""
ESTABLISHED = "01"
"""TCP_ESTABLISHED in the `st` column (include/net/tcp_states.h)."""


class Peers:
    def __init__(self, proc_net: str = PROC_NET) -> None:
        self.proc_net = proc_net
        self._uids: weakref.WeakKeyDictionary[asyncio.BaseTransport, int | None] = (
            weakref.WeakKeyDictionary()
        )

    def uid(self, transport: asyncio.BaseTransport | None) -> int | None:
        """The connecting user, or None where it cannot be known."""
        if transport is None:
            return None
        if transport not in self._uids:
            self._uids[transport] = self._lookup(transport.get_extra_info("socket"))
        return self._uids[transport]

    def _lookup(self, sock: socket.socket | None) -> int | None:
        if sock is None:
            return None
        if sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return int(struct.unpack("3i", creds)[1])
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            return self._tcp_uid(sock)
        return None

    def _tcp_uid(self, sock: socket.socket) -> int | None:
        try:
            peer, ours = sock.getpeername(), sock.getsockname()
        except OSError:
            return None
        if not ipaddress.ip_address(peer[0]).is_loopback:
            return None
        table = "tcp6" if sock.family == socket.AF_INET6 else "tcp"
        wanted = (_hex_endpoint(sock.family, peer), _hex_endpoint(sock.family, ours))
        try:
            with open(f"{self.proc_net}/{table}", encoding="ascii") as file:
                next(file, None)  # the header
                for line in file:
                    fields = line.split()
                    if len(fields) > 7 and (fields[1], fields[2]) == wanted:
                        return int(fields[7]) if fields[3] == ESTABLISHED else None
        except (OSError, ValueError):
            return None
        return None


def _hex_endpoint(family: int, endpoint: tuple[str, int] | tuple[str, int, int, int]) -> str:
    """An address and port as /proc/net/tcp{,6} prints them: the address as 32-bit words in the
    kernel's byte order, each in hex (%08X), then the port in hex (%04X)."""
    packed = socket.inet_pton(family, endpoint[0])
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{word:08X}" for word in words) + f":{endpoint[1]:04X}"
