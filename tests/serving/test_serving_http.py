"""The service through its real Unix socket: protocol endpoints, errors, load failures, reloads,
the socket's permissions and systemd socket activation."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcpd.client import Client, ServerError
from mcpd.config import ModelSection
from mcpd.listen import SocketError, bind
from tests.conftest import PROJECT
from tests.support.serving_models import mixed, scale
from tests.support.serving_server import Served, config


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    models = [
        {"name": "m", "path": str(scale(tmp_path / "scale.onnx")), "max_batch": 4},
        {"name": "mixed", "path": str(mixed(tmp_path / "mixed.onnx"))},
        {"name": "broken", "path": str(tmp_path / "missing.onnx")},
    ]
    server = Served(config(tmp_path, models, max_request_bytes=4096))
    server.wait_settled()
    yield server
    server.close()


def post(client: Client, path: str, body: bytes, **headers: str) -> tuple[int, Any]:
    reply = client.request("POST", path, body, headers)
    return reply.status, json.loads(reply.body)


def test_server_and_model_metadata(served: Served) -> None:
    with served.client() as client:
        assert client.live()
        assert client.server_metadata() == {
            "name": "mcpd",
            "version": "0.1.0",
            "extensions": [
                "binary_tensor_data",
                "system_shared_memory",
                "model_repository",
                "statistics",
                "model_configuration",
            ],
        }
        meta = client.model_metadata("m")
        assert meta == {
            "name": "m",
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [
                {"name": "double", "datatype": "FP32", "shape": [-1, 4]},
                {"name": "total", "datatype": "FP32", "shape": [-1]},
            ],
        }
        assert client.request("GET", "/v2/models/m/versions/1").json() == meta
        assert client.model_ready("m")
        assert client.request("GET", "/v2/models/m/versions/1/ready").status == 200


def test_a_model_that_fails_to_load_is_reported_and_the_others_serve(served: Served) -> None:
    with served.client() as client:
        assert not client.ready()  # strict readiness: every configured model
        assert not client.model_ready("broken")
        states = {m["name"]: (m["state"], m["reason"]) for m in client.models()}
        assert states["broken"] == (
            "UNAVAILABLE",
            f"model file {served.socket[:-9]}missing.onnx does not exist",
        )
        assert states["m"] == ("READY", "")
        with pytest.raises(ServerError) as info:
            client.infer("broken", {"x": np.zeros((1, 4), np.float32)})
        assert info.value.status == 503
        assert "model 'broken' is not ready: failed to load: model file" in info.value.message
        out = client.infer("m", {"x": np.ones((2, 4), np.float32)})
        np.testing.assert_array_equal(out["double"], np.full((2, 4), 2.0))
    failure = [e for e in served.events if e.data.get("state") == "failed"]
    assert failure and failure[0].kind == "model" and "broken" in failure[0].message
    stats = served.service.stats()
    assert not stats["broken"].ready and stats["broken"].detail["error"].startswith("model file")


def test_json_inference_with_id_and_selected_outputs(served: Served) -> None:
    request = {
        "id": "req-1",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [[1, 2, 3, 4]]}],
        "outputs": [{"name": "total"}],
    }
    with served.client() as client:
        status, body = post(client, "/v2/models/m/infer", json.dumps(request).encode())
    assert status == 200
    assert body == {
        "model_name": "m",
        "model_version": "1",
        "id": "req-1",
        "outputs": [{"name": "total", "datatype": "FP32", "shape": [1], "data": [10.0]}],
    }


def test_binary_inference_in_several_datatypes(served: Served) -> None:
    a = np.array([[1, -2], [3, 4]], np.int64)
    b = np.array([[0, 255], [7, 8]], np.uint8)
    flag = np.array([[True], [False]])
    with served.client() as client:
        out = client.infer("mixed", {"a": a, "b": b, "flag": flag}, request_id="z")
    np.testing.assert_array_equal(out["a3"], a * 3)
    np.testing.assert_array_equal(out["b_out"], b)
    np.testing.assert_array_equal(out["flag_not"], ~flag)
    assert out["a3"].dtype == np.int64 and out["flag_not"].dtype == np.bool_


BINARY = json.dumps(
    {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1, 4],
                "parameters": {"binary_data_size": 16},
            }
        ]
    }
).encode()


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"),
    [
        ("/v2/models/nope/infer", b"{}", {}, 404, "unknown model 'nope'"),
        ("/v2/models/m/versions/2/infer", b"{}", {}, 404, "model 'm' has no version '2' (only 1)"),
        ("/v2/models/m/infer", b'{"inputs": [', {}, 400, "malformed JSON in the request"),
        ("/v2/models/m/infer", b"x" * 5000, {}, 413, "over the limit of 4096 bytes"),
        (
            "/v2/models/m/infer",
            b"{}",
            {"Inference-Header-Content-Length": "ten"},
            400,
            "Inference-Header-Content-Length 'ten'",
        ),
        (
            "/v2/models/m/infer",
            BINARY + b"abc",
            {"Inference-Header-Content-Length": str(len(BINARY))},
            400,
            "binary data runs past the end",
        ),
        (
            "/v2/models/m/infer",
            json.dumps(
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2000], "data": []}]}
            ).encode(),
            {},
            400,
            "shape [1, 2000], expected [-1, 4]",
        ),
        (
            "/v2/models/m/infer",
            json.dumps(
                {
                    "inputs": [
                        {"name": "x", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                    ]
                }
            ).encode(),
            {},
            400,
            "datatype 'INT32', expected FP32",
        ),
        (
            "/v2/models/m/infer",
            json.dumps(
                {"inputs": [{"name": "x", "datatype": "FP32", "shape": [5, 4], "data": [0] * 20}]}
            ).encode(),
            {},
            400,
            "batch of 5, this model takes 1..4",
        ),
        ("/v2/nothing", b"", {}, 404, "Not Found: POST /v2/nothing"),
    ],
)
def test_bad_requests_get_the_protocol_error(
    served: Served, path: str, body: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    with served.client() as client:
        got, answer = post(client, path, body, **headers)
        assert got == status
        assert message in answer["error"]
        assert client.model_ready("m")  # nothing else is affected
        client.infer("m", {"x": np.zeros((1, 4), np.float32)})


def test_chunked_body_over_the_limit_is_413(served: Served) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(served.socket)
        chunk = b"x" * 3000
        sock.sendall(
            b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * 2
            + b"0\r\n\r\n"
        )
        reply = sock.recv(65536).decode()
    assert reply.startswith("HTTP/1.1 413")
    assert '"error": "request body of 6000 bytes over the limit of 4096 bytes' in reply


def test_errors_and_requests_are_counted(served: Served) -> None:
    with served.client() as client:
        client.infer("m", {"x": np.zeros((1, 4), np.float32)})
        post(client, "/v2/models/m/infer", b"{}")
    stats = served.service.stats()["m"]
    assert (stats.requests, stats.errors) == (2, 1)
    assert stats.p50_ms is not None and stats.p50_ms > 0
    assert stats.detail["batches"] == 1 and stats.detail["provider"] == "CPUExecutionProvider"


def test_status_and_metrics(served: Served) -> None:
    with served.client() as client:
        client.infer("m", {"x": np.zeros((1, 4), np.float32)})
        assert client.status()["governor"]["state"] == "holding"
        text = client.metrics()
        reply = client.request("GET", "/metrics")
        openmetrics = client.request(
            "GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
    assert reply.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["mcpd_temperature_celsius"].samples[0].value == 61.5
    requests = families["mcpd_inference_requests"]
    assert requests.type == "counter"
    assert {s.labels["model"]: s.value for s in requests.samples} == {
        "m": 1,
        "mixed": 0,
        "broken": 0,
    }
    ready = {s.labels["model"]: s.value for s in families["mcpd_model_ready"].samples}
    assert ready["broken"] == 0 and ready["m"] == 1
    assert openmetrics.headers["Content-Type"].startswith("application/openmetrics-text")
    assert openmetrics.body.endswith(b"# EOF\n")


def test_reload_adds_removes_and_replaces_while_others_serve(
    served: Served, tmp_path: Path
) -> None:
    m = served.service.config.models[0]
    wider = ModelSection(name="m", path=str(scale(tmp_path / "wide.onnx", width=6)), max_batch=4)
    added = ModelSection(name="added", path=m.path)
    with served.client() as client:
        served.reload([wider, added])  # "mixed" and "broken" go, "m" is replaced, "added" comes
        served.wait_settled()
        assert [e["name"] for e in client.models()] == ["added", "m"]
        assert client.model_metadata("m")["inputs"][0]["shape"] == [-1, 6]
        client.infer("added", {"x": np.zeros((1, 4), np.float32)})
        client.infer("m", {"x": np.zeros((1, 6), np.float32)})
        assert client.ready()
        # A replacement that fails leaves the running version serving.
        served.reload([dataclasses.replace(wider, path=str(tmp_path / "gone.onnx")), added])
        served.wait_settled()
        client.infer("m", {"x": np.zeros((1, 6), np.float32)})
    messages = [e.message for e in served.events]
    assert "model mixed unloaded" in messages
    assert any(m.startswith("model m reloaded in") for m in messages)
    assert any(
        m.startswith("model m reload failed, the previous version serves on") for m in messages
    )


def test_socket_is_0660_with_its_group_and_refuses_a_second_server(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    sock = bind(path, "daemon")
    try:
        info = os.stat(path)
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o660
        import grp

        assert info.st_gid == grp.getgrnam("daemon").gr_gid
        with pytest.raises(SocketError) as second:
            bind(path, "")
        assert (
            str(second.value) == f"another process (pid {os.getpid()}) is already serving on {path}"
        )
    finally:
        sock.close()
    bind(path, "").close()  # a stale socket file (nobody listening) is replaced
    with pytest.raises(SocketError, match="socket_group 'no-such-group' does not exist"):
        bind(str(tmp_path / "t.sock"), "no-such-group")


def test_socket_activation_takes_the_passed_socket(tmp_path: Path) -> None:
    path = tmp_path / "activated.sock"
    model = scale(tmp_path / "scale.onnx")
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal
        from mcpd.config import parse
        from mcpd.events import EventBus
        from mcpd.serving.service import InferenceService
        # What systemd does before exec: the socket at fd 3, LISTEN_PID naming this process.
        os.dup2(int(os.environ["TEST_FD"]), 3)
        os.environ["LISTEN_PID"] = str(os.getpid())
        async def main():
            cfg = parse({{"daemon": {{"socket": "/nonexistent/never.sock"}},
                         "models": [{{"name": "m", "path": "{model}"}}]}})
            service = InferenceService(cfg, dict, lambda name: 1, EventBus())
            await service.start()
            print("started", flush=True)
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await stop.wait()
            await service.stop()
        asyncio.run(main())
        """
    )
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=PROJECT,
        env=dict(os.environ, LISTEN_FDS="1", TEST_FD=str(listener.fileno())),
        pass_fds=[listener.fileno()],
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"started\n"
        with Client(str(path)) as client:
            assert client.live()
            assert not Path("/nonexistent/never.sock").exists()
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()
        listener.close()
    assert path.exists()  # systemd's socket is systemd's to remove
