"""Queue limits, timeouts and disconnects through the socket, with the model's batches held by a
gate (the real onnxruntime backend runs once the gate opens)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from mcpd.config import ModelSection
from mcpd.placement.plan import ModelPlacement
from mcpd.serving import backends
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config
from tests.support.waiting import wait_until
from tests.support.worker import Gated

REQUEST = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).encode()


@pytest.fixture
def gated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[Served, Gated]]]:
    held: list[tuple[Served, Gated]] = []
    real = backends.load

    def start(**model: object) -> tuple[Served, Gated]:
        gates: list[Gated] = []

        def load(section: ModelSection, placement: ModelPlacement) -> Gated:
            gates.append(Gated(real(section, placement)))
            return gates[-1]

        monkeypatch.setattr(backends, "load", load)
        path = str(scale(tmp_path / "scale.onnx"))
        served = Served(config(tmp_path, [{"name": "m", "path": path, **model}]), lambda n: 1)
        served.wait_settled()
        held.append((served, gates[0]))
        return held[-1]

    yield start
    for served, gate in held:
        gate.gate.set()
        served.close()


def send(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    sock.sendall(
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
        % (len(REQUEST), REQUEST)
    )
    return sock


def test_a_client_that_disconnects_has_its_queued_request_dropped(
    gated: Callable[..., tuple[Served, Gated]],
) -> None:
    served, gate = gated()
    running = send(served.socket)
    assert gate.entered.wait(10)
    leaving = send(served.socket)
    stats = served.service.stats
    wait_until(lambda: stats()["m"].queue_depth == 1, 10, "one queued", interval=0.005)
    leaving.close()
    wait_until(lambda: stats()["m"].queue_depth == 0, 10, "none queued", interval=0.005)
    gate.gate.set()
    assert running.recv(65536).startswith(b"HTTP/1.1 200")
    running.close()
    assert gate.batches == [1]


def test_full_queue_gets_503_at_once(gated: Callable[..., tuple[Served, Gated]]) -> None:
    served, gate = gated(max_queue_size=1)
    running = send(served.socket)
    assert gate.entered.wait(10)
    queued = send(served.socket)
    wait_until(
        lambda: served.service.stats()["m"].queue_depth == 1, 10, "one queued", interval=0.005
    )
    with served.client() as client:
        reply = client.request("POST", "/v2/models/m/infer", REQUEST)
    assert reply.status == 503
    assert json.loads(reply.body) == {"error": "model 'm' queue is full (1 requests); retry later"}
    gate.gate.set()
    for sock in (running, queued):
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.close()


def test_request_timeout(gated: Callable[..., tuple[Served, Gated]]) -> None:
    served, gate = gated(timeout_ms=50)
    running = send(served.socket)
    assert gate.entered.wait(10)
    with served.client() as client:
        reply = client.request("POST", "/v2/models/m/infer", REQUEST)
        assert reply.status == 503
        assert json.loads(reply.body)["error"] == "request timed out after 50 ms"
        gate.gate.set()
        out = client.infer("m", {"x": np.ones((1, 4), np.float32)})
    assert out["total"].tolist() == [4.0]
    running.close()
    assert gate.batches == [1, 1]  # the timed-out request was dropped, not run
