"""The HTTP/1.1 front itself (mcpd.serving.http, mcpd.serving.routes), over the real Unix socket
with raw bytes: what the protocol regression tests in test_serving_*.py do not reach (pipelining,
100-continue, HEAD, HTTP/1.0, chunked bodies, header limits, malformed framing, early answers,
shutdown with requests in flight)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mcpd.serving.http import MAX_HEADER_BYTES
from mcpd.serving.request import UNCLAIMED_BYTES
from tests.support.http import Reader
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config

INFER = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
X = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]})


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    models = [{"name": "m", "path": str(scale(tmp_path / "scale.onnx")), "max_batch": 4}]
    server = Served(config(tmp_path, models, max_request_bytes=8192, header_timeout_ms=2000))
    server.wait_settled()
    yield server
    server.close()


def connect(served: Served) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(served.socket)
    return sock


def infer(body: bytes, extra: bytes = b"") -> bytes:
    return INFER + b"Content-Length: %d\r\n" % len(body) + extra + b"\r\n" + body


def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    with connect(served) as sock:
        sock.sendall(
            infer(X.encode())
            + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
            + b"GET /v2/models/m HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        reader = Reader(sock)
        first, second, third = (reader.response() for _ in range(3))
    assert first[0] == 200 and json.loads(first[2])["outputs"][0]["data"] == [2.0] * 4
    assert second[:1] == (200,) and second[2] == b""
    assert third[0] == 200 and json.loads(third[2])["name"] == "m"


def test_expect_100_continue_is_answered_before_the_body_is_sent(served: Served) -> None:
    with connect(served) as sock:
        sock.sendall(infer(X.encode(), b"Expect: 100-continue\r\n")[: -len(X)])
        reader = Reader(sock)
        assert reader.head() == (100, {})
        sock.sendall(X.encode())
        status, _, body = reader.response()
    assert status == 200 and json.loads(body)["model_name"] == "m"


def test_a_body_over_the_limit_is_refused_without_100_continue(served: Served) -> None:
    with connect(served) as sock:
        sock.sendall(INFER + b"Content-Length: 9000\r\nExpect: 100-continue\r\n\r\n")
        reader = Reader(sock)
        status, headers, body = reader.response()
        assert status == 413 and headers["connection"] == "close"
        assert (
            "over the limit of 8192 bytes ([daemon] max_request_bytes)" in json.loads(body)["error"]
        )
        assert reader.closed()  # after lingering: the client sent nothing more


def test_a_chunked_body_is_read(served: Served) -> None:
    data = X.encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (data[:10], data[10:]))
    with connect(served) as sock:
        sock.sendall(INFER + b"Transfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n")
        status, _, body = Reader(sock).response()
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2.0] * 4


def test_a_broken_chunk_is_a_400_and_the_connection_closes(served: Served) -> None:
    with connect(served) as sock:
        sock.sendall(INFER + b"Transfer-Encoding: chunked\r\n\r\n" + b"zz\r\nabc\r\n")
        reader = Reader(sock)
        status, _, body = reader.response()
        assert status == 400 and json.loads(body)["error"].startswith("Bad Request: ")
        assert reader.closed()


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        (b"GARBAGE\r\n\r\n", 400, "Bad Request: "),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n", 400, ""),
        (
            b"GET /v2 HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n",
            431,
            f"request header over {MAX_HEADER_BYTES} bytes",
        ),
    ],
)
def test_malformed_requests_get_an_error_and_the_connection_closes(
    served: Served, request_bytes: bytes, status: int, message: str
) -> None:
    with connect(served) as sock:
        sock.sendall(request_bytes)
        reader = Reader(sock)
        got, headers, body = reader.response()
        assert (got, headers["connection"]) == (status, "close")
        assert message in json.loads(body)["error"]
        assert reader.closed()
    with served.client() as client:
        assert client.live()


def test_head_answers_the_get_head_without_the_body(served: Served) -> None:
    with connect(served) as sock:
        sock.sendall(b"HEAD /v2 HTTP/1.1\r\nHost: x\r\n\r\nGET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        reader = Reader(sock)
        status, headers, _ = reader.response(body=False)
        got, _, body = reader.response()
    assert status == got == 200 and int(headers["content-length"]) == len(body) > 0


def test_http_1_0_closes_after_the_answer(served: Served) -> None:
    with connect(served) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        reader = Reader(sock)
        status, headers, _ = reader.response()
        assert status == 200 and headers["connection"] == "close"
        assert reader.closed()


def test_a_known_path_with_another_method_is_405_and_paths_are_percent_decoded(
    served: Served,
) -> None:
    with connect(served) as sock:
        sock.sendall(
            b"GET /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /v2/models/%6d/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        reader = Reader(sock)
        status, _, body = reader.response()
        ready, _, _ = reader.response()
    assert status == 405
    assert json.loads(body)["error"] == "Method Not Allowed: GET /v2/models/m/infer"
    assert ready == 200


def test_a_body_nobody_reads_is_dropped_and_the_connection_closed(served: Served) -> None:
    with connect(served) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        sock.sendall(b"x" * (UNCLAIMED_BYTES + 65536))  # more than the server keeps unclaimed
        reader = Reader(sock)
        status, headers, _ = reader.response()
        assert status == 200 and headers["connection"] == "close"
        assert reader.closed()


def test_stop_lets_a_request_in_flight_finish(served: Served) -> None:
    entry = served.service.repository.entries["m"]
    worker = entry.worker
    assert worker is not None
    entered, release = threading.Event(), threading.Event()
    run = worker.backend.run

    def held(inputs: list[np.ndarray]) -> list[np.ndarray]:
        entered.set()
        release.wait(10)
        return run(inputs)

    worker.backend.run = held  # type: ignore[method-assign]
    with connect(served) as busy, connect(served) as idle:
        idle.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        Reader(idle).response()
        busy.sendall(infer(X.encode()))
        assert entered.wait(10)
        stopping = threading.Thread(target=lambda: served.call(served.service.stop()))
        stopping.start()
        assert Reader(idle).closed()  # an idle connection closes at once
        release.set()
        status, headers, body = Reader(busy).response()
        stopping.join(30)
    assert status == 200 and headers["connection"] == "close"
    assert json.loads(body)["outputs"][0]["data"] == [2.0] * 4


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[Served]:
    """A model whose one input (200 kB) spans several reads of the connection."""
    models = [{"name": "w", "path": str(scale(tmp_path / "wide.onnx", width=50_000))}]
    server = Served(config(tmp_path, models))
    server.wait_settled()
    yield server
    server.close()


def binary_infer(x: np.ndarray) -> bytes:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "total"}],
        }
    ).encode()
    body = header + x.tobytes()
    return (
        b"POST /v2/models/w/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
        b"Inference-Header-Content-Length: %d\r\n\r\n" % (len(body), len(header))
    ) + body


@pytest.mark.parametrize("split", ["whole", "head split in its end", "pieces"])
def test_a_large_body_arrives_whole_however_it_is_split(wide: Served, split: str) -> None:
    x = np.arange(50_000, dtype=np.float32).reshape(1, -1) % 7
    data = binary_infer(x) + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    head_end = data.index(b"\r\n\r\n")
    cuts = {
        "whole": [],
        "head split in its end": [head_end + 3],
        "pieces": [100, head_end + 2, head_end + 4, 70_000, 140_000, 200_000],
    }[split]
    with connect(wide) as sock:
        for start, stop in zip([0, *cuts], [*cuts, len(data)], strict=True):
            sock.sendall(data[start:stop])
        reader = Reader(sock)
        status, _, body = reader.response()
        live, _, _ = reader.response()
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [float(x.sum())]
    assert live == 200


def test_a_whole_body_received_at_once_before_its_handler_runs_does_not_stall_the_connection(
    served: Served,
) -> None:
    """uvloop hands the protocol whole reads through data_received (not into get_buffer), so a
    body over the unclaimed bound can be complete before its handler's first step."""
    with connect(served) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        reader = Reader(sock)
        assert reader.response()[0] == 200
        assert served.service.server is not None
        (protocol,) = served.service.server.connections
        body = b"x" * (UNCLAIMED_BYTES + 1000)
        data = b"GET /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        served.loop.call_soon_threadsafe(protocol.data_received, data)
        assert reader.response()[0] == 200
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # still read
        assert reader.response()[0] == 200


def test_nothing_after_a_request_that_closes_the_connection_is_answered(served: Served) -> None:
    with connect(served) as sock:
        sock.sendall(
            b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        reader = Reader(sock)
        status, headers, _ = reader.response()
        assert status == 200 and headers["connection"] == "close"
        assert reader.closed()
