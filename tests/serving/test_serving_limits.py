"""What clients together may take: connections (a cap under the descriptor limit, 503 beyond it),
time (header, body and send timeouts), memory (request bodies and unread answers alone and
together, JSON apart) and log lines (throttled). The flood test is the reproduction: a flood of
half-sent requests against the real daemon no longer stops it from writing caps."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import psutil
import pytest

from mcpd.client import Client
from mcpd.serving.connections import RESERVED_DESCRIPTORS, connection_cap
from mcpd.serving.http import READ_BYTES
from mcpd.serving.limits import Throttle
from mcpd.serving.responses import InferResponse
from mcpd.serving.service import METRICS_CONNECTIONS
from tests.support.daemon import DaemonProcess, simulated
from tests.support.http import Reader
from tests.support.mqtt_broker import free_port
from tests.support.serving_models import scale, spread
from tests.support.serving_server import Served, config
from tests.support.waiting import wait_until

HEAD = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


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


def test_over_the_cap_clients_wait_until_the_header_timeout_frees_a_connection(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    with ExitStack() as stack:
        half_sent = [stack.enter_context(connect(served, HEAD[:20])) for _ in range(4)]
        started = time.monotonic()
        # A fifth client waits in the backlog, not accepted, until the header timeout (2 s) closes
        # the half-sent requests (75 s before, aiohttp's default).
        with connect(served, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n") as waiting:
            assert waiting.recv(65536).startswith(b"HTTP/1.1 200")
        waited = time.monotonic() - started
        for sock in half_sent:
            assert answer(sock) == b""
    assert 1.5 < waited < 10
    assert served.service.connections is not None and served.service.connections.capped >= 1
    capped = [r for r in caplog.records if "new connections wait" in r.getMessage()]
    assert len(capped) == 1  # throttled: one line per 10 s
    assert capped[0].getMessage().startswith("4 client connections are open")


def unread(address: str | tuple[str, int]) -> socket.socket:
    """A client that pipelines requests for as long as the server takes them and never reads an
    answer."""
    sock = socket.socket(socket.AF_UNIX if isinstance(address, str) else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's least
    sock.settimeout(10)
    sock.connect(address)
    sock.setblocking(False)
    with contextlib.suppress(OSError):  # full, or already dropped by the server
        while True:
            sock.send(SCRAPE * 64)
    return sock


def test_clients_that_do_not_read_lose_their_connection_after_the_send_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Clients that sent requests and read nothing held their connections for good: closing one
    waited for its answers to be sent. Enough of them took every connection of the socket and of
    the metrics port (issue 26: a new client had no answer in 40 s)."""
    port = free_port()
    limits = {"max_connections": 4, "header_timeout_ms": 500, "send_timeout_ms": 500}
    served = Served(config(tmp_path, [], metrics=f"127.0.0.1:{port}", **limits))
    try:
        with ExitStack() as stack:
            listeners = ((served.socket, 4), (("127.0.0.1", port), METRICS_CONNECTIONS))
            for address, cap in listeners:
                for _ in range(cap):
                    stack.enter_context(unread(address))
            for address, _ in listeners:
                # Waits in the backlog until the send timeout drops a client that does not read.
                family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
                with socket.socket(family) as waiting:
                    waiting.settimeout(30)
                    waiting.connect(address)
                    waiting.sendall(SCRAPE)
                    assert waiting.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        served.close()
    dropped = [r.getMessage() for r in caplog.records if "send_timeout_ms" in r.getMessage()]
    assert len(dropped) == 1, dropped  # throttled: one line per 10 s
    assert dropped[0].startswith("closed a connection whose client took nothing of its answers")


def test_a_client_that_reads_slowly_keeps_its_connection(tmp_path: Path) -> None:
    """The send timeout runs between two writes the kernel takes, not over the answers: a client
    that takes ~3 MB of answers at ~1 MB/s outlasts a 1 s send timeout."""
    served = Served(config(tmp_path, [], send_timeout_ms=1000))
    try:
        with served.client() as client:
            scrape = len(client.request("GET", "/metrics").body)
        count = 3 * 2**20 // scrape
        with socket.socket(socket.AF_UNIX) as slow:
            slow.settimeout(10)
            slow.connect(served.socket)
            slow.sendall(SCRAPE * count)
            answers = b""
            while answers.count(b"HTTP/1.1 200 ") < count:
                chunk = slow.recv(65536)
                assert chunk, f"dropped after {answers.count(b'HTTP/1.1 200 ')} answers"
                answers += chunk
                time.sleep(0.05)
        assert served.service.server is not None and served.service.server.send_timeouts == 0
    finally:
        served.close()


def test_answers_a_client_does_not_read_are_bounded_and_count_against_max_inflight_bytes(
    served: Served,
) -> None:
    """A client that pipelined requests and read nothing had every one of them answered into the
    transport's buffer, uncounted, and the requests still to answer grew too (issue 26: 92 MiB
    buffered and 380 000 requests queued on 16 connections in 11 s)."""
    with served.client() as client:
        scrape = len(client.request("GET", "/metrics").body)
    bodies, server = served.service.endpoints.bodies, served.service.server
    assert server is not None

    async def waiting() -> tuple[int, list[tuple[int, int]]]:
        """Between the event loop's steps: what is held, and each connection that has requests
        to answer but answers none: how many, and the bytes it keeps unsent."""
        return bodies.held, [
            (len(c.pipeline), c.transport.get_write_buffer_size())
            for c in server.connections
            if c.pipeline and c.task is None and c.transport is not None
        ]

    with socket.socket(socket.AF_UNIX) as hog:
        hog.settimeout(10)
        hog.connect(served.socket)
        hog.sendall(SCRAPE * 2000)  # 68 kB: more than one read
        # Answered until the transport holds more than its high-water mark, then no more.

        def held_back() -> Any:
            state = served.call(waiting())
            return state if state[1] else None

        held, [(queued, unsent)] = wait_until(held_back, 10, "answers held", interval=0.01)
        assert 10000 < held == unsent <= 65536 + 2 * scrape
        assert queued <= READ_BYTES // len(SCRAPE) + 1  # the requests of one read at most
        status, message = post(served, b"x" * 100, **{"Inference-Header-Content-Length": "10"})
        assert status == 503
        assert "busy: requests in flight hold" in message
        # Once the client reads, the rest is answered, in order.
        reader = Reader(hog)
        assert all(reader.response()[0] == 200 for _ in range(2000))
    # given back when the connection closes
    wait_until(lambda: not bodies.held, 10, "the body bytes given back", interval=0.01)


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
        bodies = served.service.endpoints.bodies
        wait_until(lambda: bodies.held, 5, "the slow body's bytes held", interval=0.01)
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
    throttle = Throttle(interval_s=10, per_logger=3, clock=lambda: now[0])
    logger = logging.getLogger("asyncio")

    def record(message: str) -> logging.LogRecord:
        return logger.makeRecord("asyncio", logging.ERROR, __file__, 1, message, (), None)

    accept = "socket.accept() out of system resource\nsocket: <socket fd=6>"
    assert throttle.filter(record(accept))
    assert not any(throttle.filter(record(accept)) for _ in range(1000))
    # Messages that differ get through, but only so many per logger and interval.
    varying = [record(f"Exception in callback <Handle {n}>") for n in range(50)]
    assert [throttle.filter(r) for r in varying] == [True, True] + [False] * 48
    assert varying[0].getMessage().endswith("(1000 similar lines dropped before this one)")
    now[0] = 10.0
    again = record(accept)
    assert throttle.filter(again)
    assert again.getMessage().endswith("(48 similar lines dropped before this one)")
    other = logger.makeRecord("mcpd.serving.http", logging.ERROR, __file__, 1, accept, (), None)
    assert throttle.filter(other)  # each logger has its own allowance


def test_a_line_and_a_loggers_allowance_count_their_interval_from_when_they_were_said() -> None:
    now = [0.0]
    throttle = Throttle(interval_s=10, per_logger=3, clock=lambda: now[0])
    logger = logging.getLogger("asyncio")

    def passes(message: str) -> bool:
        return throttle.filter(
            logger.makeRecord("asyncio", logging.ERROR, __file__, 1, message, (), None)
        )

    now[0] = 9.5
    assert [passes(f"line {n}") for n in range(4)] == [True, True, True, False]
    now[0] = 10.5  # a second later: neither the lines nor the allowance are due again
    assert not passes("line 0") and not passes("another line")
    now[0] = 19.5
    assert passes("line 0") and passes("line 3")  # line 3 was dropped, never said: not quiet


def serving(sock: Path) -> bool:
    try:
        with Client(str(sock), timeout=5) as client:
            return client.live()
    except OSError:
        return False


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
    daemon = DaemonProcess(
        cfg,
        *simulated("jetson-orin-nano", board),
        log=tmp_path / "daemon.log",
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512)),
    )
    process = daemon.process
    try:
        # the governor binds at once; serving answers later
        daemon.wait_until(lambda: serving(sock_path), 60, "the serving process")
        caps = sorted(board.glob("sys/devices/system/cpu/cpufreq/policy*/scaling_max_freq"))
        before = {path: path.read_text() for path in caps}
        (child,) = psutil.Process(process.pid).children()
        with ExitStack() as stack:
            # The cap (512 less the reserve) and a full backlog (128) take 448 of them.
            assert len(flood(sock_path, 700, stack)) >= 512 - RESERVED_DESCRIPTORS
            # Descriptors to spare: serving accepts no more than its cap; the governor, a
            # process of its own, holds a few dozen whatever clients do.
            assert len(os.listdir(f"/proc/{child.pid}/fd")) < 512 - 100
            assert len(os.listdir(f"/proc/{process.pid}/fd")) < 100
            configure(30.0, 25.0)  # now throttle: the loop must write the caps
            process.send_signal(signal.SIGHUP)
            daemon.wait_until(
                lambda: any(path.read_text() != before[path] for path in caps), 20, "a cap written"
            )
        text = daemon.log_text()
        assert "Too many open files" not in text
        assert text.count("new connections wait") <= 2
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, daemon.log_text()


def flood(path: Path, count: int, stack: ExitStack) -> list[socket.socket]:
    """Up to `count` connections that each send half a header, made as fast as the server's
    backlog takes them, until it has taken none for a second."""
    made: list[socket.socket] = []
    quiet_since = time.monotonic()
    while len(made) < count and time.monotonic() - quiet_since < 1.0:
        sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        sock.setblocking(False)
        try:
            sock.connect(str(path))
        except BlockingIOError:  # the backlog is full
            sock.close()
            time.sleep(0.01)
            continue
        sock.send(HEAD[:20])
        made.append(sock)
        quiet_since = time.monotonic()
    return made


def test_a_reload_applies_the_body_limits_at_once(served: Served) -> None:
    body = json.dumps({"inputs": [], "pad": "x" * 3000}).encode()
    assert post(served, body)[0] == 413
    cfg = served.service.config
    looser = dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, max_json_bytes=4096))
    served.call(served.service.reload(looser))
    status, message = post(served, body)
    assert status == 400 and "inputs must be a non-empty list" in message


def spreading(tmp_path: Path, width: int, **limits: Any) -> Served:
    """Serving `s`: one value in, `width` values out."""
    models = [{"name": "s", "path": str(spread(tmp_path / "spread.onnx", width))}]
    server = Served(config(tmp_path, models, **limits))
    server.wait_settled()
    return server


def spread_request(**parameters: object) -> bytes:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}]
    return json.dumps({"inputs": inputs, "parameters": parameters}).encode()


def test_json_outputs_over_max_json_output_bytes_are_413_naming_binary_data_output(
    tmp_path: Path,
) -> None:
    """A request of 100 bytes for a model with a large output used to have it all written as
    JSON, whatever it cost (issue 26: 726 MB for one request)."""
    served = spreading(tmp_path, 100_000, max_json_output_bytes=2**20)
    try:
        with served.client() as client:
            refused = client.request("POST", "/v2/models/s/infer", spread_request())
            assert refused.status == 413
            message = json.loads(refused.body)["error"]
            assert "over the limit of 1048576 bytes ([daemon] max_json_output_bytes)" in message
            assert "binary_data_output" in message
            binary = client.request(
                "POST", "/v2/models/s/infer", spread_request(binary_data_output=True)
            )
            assert binary.status == 200
            length = int(binary.headers["inference-header-content-length"])
            assert np.frombuffer(binary.body[length:], np.float32).tolist() == [0.5] * 100_000
    finally:
        served.close()


def writing_json() -> bool:
    """Whether a thread of this process (the server's) is writing an answer's JSON values now."""
    code = InferResponse.encode.__code__
    for frame in sys._current_frames().values():
        caller: FrameType | None = frame
        while caller is not None:
            if caller.f_code is code:
                return True
            caller = caller.f_back
    return False


def test_a_large_json_answer_is_written_while_the_event_loop_answers_others(
    tmp_path: Path,
) -> None:
    """Writing a large JSON answer held the event loop for as long (issue 26: 3.7 s for one
    request, 16 s for four); 2 million values take about a second here."""
    served = spreading(tmp_path, 2_000_000, max_json_output_bytes=2**26)
    try:
        answers: list[int] = []

        def large() -> None:
            with served.client() as client:
                answers.append(
                    client.request("POST", "/v2/models/s/infer", spread_request()).status
                )

        thread = threading.Thread(target=large)
        thread.start()

        def writing() -> bool:
            if writing_json():
                return True
            assert thread.is_alive()
            return False

        wait_until(writing, 30, "the large answer being written", interval=0.005)
        with served.client() as client:
            assert client.live()
        assert writing_json()  # answered while the large answer is still being written
        thread.join(60)
        assert answers == [200]
    finally:
        served.close()
