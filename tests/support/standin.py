"""One request to the governor's stand-in for the serving process, run until it answers."""

from __future__ import annotations

import select
import socket
import time

from mcpd.governor.standin import StandIn


def ask(standin: StandIn, address: tuple[str, int] | str, request: bytes) -> str:
    """Send one request to the stand-in and run it until the answer is complete."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family) as client:
        client.connect(address)
        client.sendall(request)
        client.setblocking(False)
        answer, deadline = b"", time.monotonic() + 10
        while time.monotonic() < deadline:
            readable, _, _ = select.select(standin.fds(), [], [], 0.05)
            for fd in readable:
                standin.ready(fd)
            try:
                data = client.recv(65536)
            except BlockingIOError:
                continue
            if not data:  # the stand-in closes its side after the answer
                return answer.decode()
            answer += data
        raise AssertionError(f"no complete answer: {answer!r}")
