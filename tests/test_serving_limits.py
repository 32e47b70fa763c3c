"""What clients together may take: connections (a cap under the descriptor limit, 503 beyond it),
time (header and body timeouts), memory (request bodies alone and together, JSON apart) and log
lines (throttled). The last test is the reproduction: a flood of half-sent requests against the
real daemon no longer stops it from writing caps."""

from __future__ import annotations

import json
import logging
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from mcpd.serving.limits import RESERVED_DESCRIPTORS, Throttle, connection_cap
from tests.conftest import PROJECT
from tests.serving_models import scale
from tests.serving_server import Served, config

HEAD = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    models = [{"name": "m", "path": str(scale(tmp_path / "scale.onnx")), "max_batch": 4}]
    limits = {
        "max_connections": 4,
        "header_timeout_ms": 2000,
        "body_timeout_ms": 2000,
        "max_request_bytes": 8192,
        "max_json_bytes": 2048,
        "max_inflight_bytes": 10000,
    }
    server = Served(config(tmp_path, models, **limits))
    server.wait_settled()
    yield server
    server.close()


def connect(served: Served, data: bytes = b"") -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(served.socket)
    sock.sendall(data)
    return sock


def answer(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_connection_over_the_cap_gets_503_and_the_cap_frees_after_the_header_timeout(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    with ExitStack() as stack:
        half_sent = [stack.enter_context(connect(served, HEAD[:20])) for _ in range(4)]
        for _ in range(5):
            with connect(served) as refused:
                reply = answer(refused)
            assert reply.startswith(b"HTTP/1.1 503")
            assert b"too many connections: mcpd serves at most 4 at once" in reply
        # The header timeout closes the half-sent requests (75 s before, aiohttp's default).
        started = time.monotonic()
        for sock in half_sent:
            assert answer(sock) == b""
        assert time.monotonic() - started < 10
    with served.client() as client:
        client.infer("m", {"x": np.zeros((1, 4), np.float32)})
    refusals = [r for r in caplog.records if "connection refused" in r.getMessage()]
    assert len(refusals) == 1  # throttled: one line per 10 s
    assert "4 client connections are open, the cap is 4" in refusals[0].getMessage()


def test_a_body_that_does_not_arrive_in_time_is_408(served: Served) -> None:
    with connect(served, HEAD + b"Content-Length: 100\r\n\r\n{") as sock:
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 408")
    assert b"did not arrive within 2000 ms ([daemon] body_timeout_ms)" in reply


def post(served: Served, body: bytes, **headers: str) -> tuple[int, str]:
    with served.client() as client:
        reply = client.request("POST", "/v2/models/m/infer", body, headers)
    return reply.status, json.loads(reply.body)["error"]


def test_json_has_a_smaller_limit_than_binary_tensors(served: Served) -> None:
    big_json = json.dumps({"inputs": [], "pad": "x" * 3000}).encode()
    status, message = post(served, big_json)
    assert status == 413
    assert "over the limit of 2048 bytes ([daemon] max_json_bytes)" in message
    assert "send big tensors as binary data" in message
    status, message = post(served, big_json, **{"Inference-Header-Content-Length": "3000"})
    assert status == 413
    assert (
        "JSON header of 3000 bytes over the limit of 2048 bytes ([daemon] max_json_bytes)"
        in message
    )
    # Binary tensors may take the whole max_request_bytes.
    x = np.zeros((4, 4), np.float32)
    with served.client() as client:
        assert client.infer("m", {"x": x})["double"].shape == (4, 4)
    status, message = post(served, b"x" * 9000, **{"Inference-Header-Content-Length": "10"})
    assert status == 413 and "([daemon] max_request_bytes)" in message


def test_bodies_held_at_once_are_bounded(served: Served) -> None:
    head = HEAD + b"Inference-Header-Content-Length: 10\r\nContent-Length: 6000\r\n\r\n"
    with connect(served, head + b"{") as slow:  # holds 6000 bytes while its body trickles in
        deadline = time.monotonic() + 5
        while served.service.endpoints.bodies.held == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        status, message = post(served, b"x" * 6000, **{"Inference-Header-Content-Length": "10"})
        assert status == 503
        assert "busy: requests in flight hold 6000 of the 10000 bytes allowed" in message
        assert answer(slow).startswith(b"HTTP/1.1 408")
    assert served.service.endpoints.bodies.held == 0
    status, message = post(served, b"x" * 6000, **{"Inference-Header-Content-Length": "10"})
    assert status == 400  # taken, and then refused for what it holds


def test_the_cap_stays_below_the_descriptor_limit() -> None:
    assert connection_cap(256, descriptors=1024) == 256
    assert connection_cap(1024, descriptors=1024) == 1024 - RESERVED_DESCRIPTORS
    assert connection_cap(256, descriptors=10) == 1
    assert connection_cap(256, descriptors=resource.RLIM_INFINITY) == 256


def test_repeated_log_lines_are_throttled() -> None:
    now = [0.0]
    throttle = Throttle(interval_s=10, clock=lambda: now[0])
    logger = logging.getLogger("asyncio")

    def record(message: str) -> logging.LogRecord:
        return logger.makeRecord("asyncio", logging.ERROR, __file__, 1, message, (), None)

    accept = "socket.accept() out of system resource\nsocket: <socket fd=6>"
    assert throttle.filter(record(accept))
    assert not any(throttle.filter(record(accept)) for _ in range(1000))
    assert throttle.filter(record("another message"))
    now[0] = 10.0
    again = record(accept)
    assert throttle.filter(again)
    assert again.getMessage().endswith("(1000 more like this in the last 10 s)")


def test_a_flood_of_half_sent_requests_does_not_stop_the_governor(tmp_path: Path) -> None:
    """1 100 half-sent requests against a 1 024-descriptor limit used to leave no descriptor for
    cap writes; here 700 against 512."""
    sock_path = tmp_path / "mcpd.sock"
    cfg = tmp_path / "mcpd.toml"
    board = tmp_path / "board"

    def configure(high: float, low: float) -> None:
        cfg.write_text(
            f'[daemon]\nsocket = "{sock_path}"\nstate_dir = "{tmp_path / "state"}"\n'
            "header_timeout_ms = 60000\n"
            f"[governor]\ntemp_high_c = {high}\ntemp_low_c = {low}\n"
        )

    configure(140.0, 130.0)  # nothing to do: the caps stay at their maximum
    log = tmp_path / "daemon.log"
    command = [sys.executable, "-m", "mcpd", "run", "--config", str(cfg),
               "--simulate", "jetson-orin-nano", "--sim-root", str(board)]  # fmt: skip
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            command,
            cwd=PROJECT,
            stderr=stderr,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512)),
        )
    try:
        deadline = time.monotonic() + 60
        while not sock_path.exists():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        caps = sorted(board.glob("sys/devices/system/cpu/cpufreq/policy*/scaling_max_freq"))
        before = {path: path.read_text() for path in caps}
        with ExitStack() as stack:
            flood = [stack.enter_context(connect_path(sock_path, HEAD[:20])) for _ in range(700)]
            refused = [reply for reply in answered(flood) if reply.startswith(b"HTTP/1.1 503")]
            assert len(refused) == 700 - (512 - RESERVED_DESCRIPTORS)
            configure(30.0, 25.0)  # now throttle: the loop must write the caps
            process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 20
            while all(path.read_text() == before[path] for path in caps):
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        text = log.read_text()
        assert "Too many open files" not in text
        assert text.count("connection refused:") <= 2
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()


def connect_path(path: Path, data: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))  # blocking: waits while the backlog is full
    sock.settimeout(10)
    sock.sendall(data)
    return sock


def answered(socks: list[socket.socket]) -> list[bytes]:
    """What the server has answered on these connections until it has gone quiet for 1 s."""
    waiting = {sock.fileno(): sock for sock in socks}
    replies = []
    while waiting:
        readable, _, _ = select.select(list(waiting.values()), [], [], 1.0)
        if not readable:
            break
        for sock in readable:
            replies.append(sock.recv(65536))
            del waiting[sock.fileno()]
    return replies
