"""HTTP responses read off a raw socket, one at a time, as a client that pipelines sees them."""

from __future__ import annotations

import socket


class Reader:
    """Responses off a socket, one at a time, framed by Content-Length."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, f"closed after {self.buffer!r}"
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status, *fields = head.decode().split("\r\n")
        headers = {k.lower(): v for k, v in (f.split(": ", 1) for f in fields)}
        return int(status.split()[1]), headers

    def response(self, body: bool = True) -> tuple[int, dict[str, str], bytes]:
        status, headers = self.head()
        length = int(headers["content-length"]) if body else 0
        while len(self.buffer) < length:
            chunk = self.sock.recv(65536)
            assert chunk
            self.buffer += chunk
        data, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, headers, data

    def closed(self) -> bool:
        return self.buffer == b"" and self.sock.recv(65536) == b""
