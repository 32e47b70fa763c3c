"""The governor's stand-in for the serving process during a crash loop (mcpd/governor/standin.py),
driven on real sockets with an injected clock."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from mcpd.governor.standin import STATUS_CACHE_S, StandIn
from tests.support.clock import FakeClock
from tests.support.standin import ask

STATUS = b"GET /v2/mcpd/status HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_flood_of_status_requests_builds_the_document_once_per_interval(tmp_path: Path) -> None:
    """The document was built for every request: 78 % of a core of the real-time governor under
    a status flood during a crash loop. Now once per STATUS_CACHE_S, however many ask."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "s.sock"))
    listener.listen()
    listener.setblocking(False)
    built: list[float] = []
    clock = FakeClock(100.0)

    def status() -> dict[str, object]:
        built.append(clock.now)
        return {"temperature_c": 70.0, "built": len(built)}

    standin = StandIn([listener], status, lambda: ("the serving process exited", 4.0), clock)  # type: ignore[arg-type]
    try:
        answers = [ask(standin, str(tmp_path / "s.sock"), STATUS) for _ in range(50)]
        assert len(built) == 1
        assert all(a.startswith("HTTP/1.1 200 ") and a.endswith('"built": 1}') for a in answers)
        start = clock.now
        clock.now = start + STATUS_CACHE_S / 2
        assert ask(standin, str(tmp_path / "s.sock"), STATUS).endswith('"built": 1}')
        clock.now = start + STATUS_CACHE_S
        fresh = ask(standin, str(tmp_path / "s.sock"), STATUS)
        assert json.loads(fresh.split("\r\n\r\n", 1)[1]) == {"temperature_c": 70.0, "built": 2}
        assert len(built) == 2
    finally:
        standin.close()
        listener.close()
