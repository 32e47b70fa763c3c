"""Triton's model repository extension on the real socket: index, load (the configured file read
again, swapped in while requests in flight finish on the old session) and unload."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mcpd.client import Client, ServerError
from mcpd.config import ModelSection
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config
from tests.support.waiting import wait_until


class Gate:
    """A batch size callable that, once armed, holds the next model thread that asks for it
    (a worker asks before taking each batch) until opened: a request stays queued in that
    worker, in flight, for as long as the test wants."""

    def __init__(self) -> None:
        self.armed = False
        self.held = threading.Event()
        self.opened = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, name: str) -> int:
        with self._lock:
            hold, self.armed = self.armed, False
        if hold:
            self.held.set()
            self.opened.wait(30)
        return 8


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def served(tmp_path: Path, gate: Gate) -> Iterator[Served]:
    models = [
        {"name": "m", "path": str(scale(tmp_path / "m.onnx", width=4))},
        {"name": "other", "path": str(scale(tmp_path / "other.onnx"))},
    ]
    server = Served(config(tmp_path, models), batch_size=gate)
    server.wait_settled()
    yield server
    gate.opened.set()
    server.close()


def post(client: Client, path: str, body: object = None) -> tuple[int, Any]:
    payload = b"" if body is None else json.dumps(body).encode()
    reply = client.request("POST", path, payload)
    return reply.status, json.loads(reply.body) if reply.body else None


def replace(path: Path, width: int) -> None:
    scale(path.with_suffix(".new"), width=width)
    os.replace(path.with_suffix(".new"), path)  # by rename, as deployments do


def test_index_lists_states_and_filters_ready(served: Served) -> None:
    with served.client() as client:
        assert "model_repository" in client.server_metadata()["extensions"]
        client.unload("other")
        everything = [
            {"name": "m", "version": "1", "state": "READY", "reason": ""},
            {"name": "other", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        ]
        assert post(client, "/v2/repository/index") == (200, everything)
        assert post(client, "/v2/repository/index", {"ready": True}) == (200, everything[:1])
        assert post(client, "/v2/repository/index", {"ready": "yes"}) == (
            400,
            {"error": "index: ready must be true or false"},
        )


def test_load_picks_up_a_replaced_file_while_requests_in_flight_finish_on_the_old_one(
    served: Served, gate: Gate, tmp_path: Path
) -> None:
    old_worker = served.service.repository.entries["m"].worker
    replace(tmp_path / "m.onnx", width=6)
    answers: dict[str, Any] = {}

    def in_flight() -> None:
        with served.client() as client:
            answers["old"] = client.infer("m", {"x": np.ones((1, 4), np.float32)})

    def load() -> None:
        with served.client() as client:
            answers["load"] = post(client, "/v2/repository/models/m/load")

    gate.armed = True
    requester = threading.Thread(target=in_flight)
    requester.start()
    assert gate.held.wait(10)  # the request sits in the old worker's queue
    loader = threading.Thread(target=load)
    loader.start()
    entries = served.service.repository.entries
    wait_until(lambda: entries["m"].worker is not old_worker, 30, "the new session", interval=0.01)
    with served.client() as client:
        assert client.model_metadata("m")["inputs"][0]["shape"] == [-1, 6]
        new = client.infer("m", {"x": np.ones((1, 6), np.float32)})
        assert new["double"].tolist() == [[2.0] * 6]
    assert "old" not in answers and loader.is_alive()  # the load waits for the old one's queue
    gate.opened.set()
    requester.join(10)
    loader.join(10)
    assert answers["old"]["double"].tolist() == [[2.0] * 4]
    assert answers["load"] == (200, None)
    assert any(e.message.startswith("model m reloaded in") for e in served.events)


def test_a_load_of_a_bad_file_names_it_and_the_old_session_serves_on(
    served: Served, tmp_path: Path
) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"not a model")
    with served.client() as client:
        status, body = post(client, "/v2/repository/models/m/load")
        assert status == 400
        assert body["error"].startswith(
            f"model 'm': loading {path} failed (the previous version serves on): "
            f"onnxruntime cannot load {path}:"
        )
        client.infer("m", {"x": np.ones((1, 4), np.float32)})
        [entry] = [e for e in client.models() if e["name"] == "m"]
        assert entry["state"] == "READY"
        # Unloaded, the same failure leaves it unavailable, with the reason.
        client.unload("m")
        status, body = post(client, "/v2/repository/models/m/load")
        assert status == 400 and "(it does not serve)" in body["error"]
        [entry] = [e for e in client.models() if e["name"] == "m"]
        assert entry["state"] == "UNAVAILABLE"
        assert entry["reason"].startswith(f"onnxruntime cannot load {path}")


def test_unload_answers_as_triton_and_lasts_until_a_load(served: Served) -> None:
    x = {"x": np.ones((1, 4), np.float32)}
    with served.client() as client:
        client.unload("m")
        client.unload("m")  # unloading an unloaded model is no error (Triton's neither)
        with pytest.raises(ServerError) as unversioned:
            client.infer("m", x)
        assert unversioned.value.status == 404
        assert unversioned.value.message == (
            "model 'm' is unloaded; POST /v2/repository/models/m/load loads it"
        )
        status, _ = post(client, "/v2/models/m/versions/1/infer", {"inputs": []})
        assert status == 503
        assert not client.model_ready("m")
        assert client.ready()  # an unloaded model does not make the server unready
        client.infer("other", x)
        # A config reload (SIGHUP) does not bring it back: only a load does.
        served.reload(list(served.service.config.models))
        served.wait_settled()
        assert not client.model_ready("m")
        client.load("m")
        assert client.model_ready("m")
        assert client.infer("m", x)["total"].tolist() == [4.0]
    assert "model m unloaded on request" in [e.message for e in served.events]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"parameters": {"config": '{"backend": "onnxruntime"}'}},
            "load: parameter 'config' is not accepted: mcpd loads only the models of its "
            "configuration, from the path there ([[models]] path)",
        ),
        ({"parameters": {"file:1/model.onnx": "AAAA"}}, "load: parameter 'file:1/model.onnx'"),
        ({"path": "/etc/shadow"}, "load: field 'path' is not accepted (only parameters)"),
        ({"parameters": "x"}, "load: parameters must be a JSON object"),
        ([1], "the load request: the body must be a JSON object"),
    ],
)
def test_load_refuses_a_body_that_names_a_file(served: Served, body: object, error: str) -> None:
    with served.client() as client:
        status, answer = post(client, "/v2/repository/models/m/load", body)
        assert status == 400 and answer["error"].startswith(error)
    assert not served.service.repository.loading  # nothing was started


def test_load_and_unload_of_unknown_models_and_bad_parameters(served: Served) -> None:
    with served.client() as client:
        assert post(client, "/v2/repository/models/nope/load") == (
            404,
            {"error": "unknown model 'nope'"},
        )
        assert post(client, "/v2/repository/models/nope/unload")[0] == 404
        assert post(
            client, "/v2/repository/models/m/unload", {"parameters": {"unload_dependents": 1}}
        ) == (400, {"error": "unload: unload_dependents must be true or false"})
        assert post(client, "/v2/repository/models/m/unload", {"parameters": {"path": "/x"}}) == (
            400,
            {"error": "unload: parameter 'path' is not accepted (only unload_dependents)"},
        )
        assert client.model_ready("m")
        assert post(
            client, "/v2/repository/models/m/unload", {"parameters": {"unload_dependents": False}}
        ) == (200, None)


def test_a_removed_model_cannot_be_loaded(served: Served) -> None:
    served.reload([ModelSection(name="other", path=served.service.config.models[1].path)])
    served.wait_settled()
    with served.client() as client:
        assert post(client, "/v2/repository/models/m/load")[0] == 404


def test_a_request_whose_body_arrives_across_a_reload_runs_on_the_new_session(
    tmp_path: Path,
) -> None:
    """The worker serving when a request's head arrived may be retired by a reload before its
    body is in; the request runs on the one serving once it is (it was a 503 "being unloaded")."""
    served = Served(config(tmp_path, [{"name": "m", "path": str(scale(tmp_path / "m.onnx"))}]))
    try:
        served.wait_settled()
        body = json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        ).encode()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect(served.socket)
            sock.sendall(
                b"POST /v2/models/m/infer HTTP/1.1\r\nHost: mcpd\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body[:10]
            )
            time.sleep(0.2)  # the head is parsed and the worker looked up before the reload
            served.call(served.service.repository.load("m"))
            sock.sendall(body[10:])
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b'"data":[2.0,4.0,6.0,8.0]' in answer.replace(b" ", b"")
    finally:
        served.close()
