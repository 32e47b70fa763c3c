"""The governor and the serving process: serving dies of anything, the governor keeps governing,
restarts it, keeps its socket, slows a crash loop down and answers status meanwhile."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.client import Client
from mcpd.demo import MODEL
from tests.conftest import PROJECT
from tests.test_daemon import RunningDaemon

# pydantic (18 MB), psutil (2.7 MB) and prometheus_client (10.4 MB, docs/metrics.md) of a 40 MB
# budget (BENCHMARKS.md): mcpd.schema checks the config, mcpd.status reads /proc itself, and the
# serving process renders /metrics.
FORBIDDEN = (
    "numpy",
    "onnxruntime",
    "httptools",
    "rknnlite",
    "pydantic",
    "pydantic_core",
    "psutil",
    "prometheus_client",
)


def slow_model(path: Path, layers: int = 240, size: int = 1024) -> Path:
    """x FP32 [N, size, size] -> y: `layers` matrix products, about 500 GFLOP per row: seconds
    even on a fast machine (60 took 0.4 s on a 2-core x86)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.eye(size, dtype=np.float32), "w")
    nodes, previous = [], "x"
    for layer in range(layers):
        nodes.append(helper.make_node("MatMul", [previous, "w"], [f"h{layer}"]))
        previous = f"h{layer}"
    nodes.append(helper.make_node("Identity", [previous], ["y"]))
    shape = ["N", size, size]
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., tuple[RunningDaemon, Path]]]:
    started: list[RunningDaemon] = []

    def start(*models: tuple[str, Path]) -> tuple[RunningDaemon, Path]:
        sock = tmp_path / "mcpd.sock"
        config = f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n' + "".join(
            f'[[models]]\nname = "{name}"\npath = "{path}"\nmax_batch = 4\n'
            for name, path in models
        )
        started.append(RunningDaemon(tmp_path, config))
        daemon = started[-1]
        daemon.wait_for(lambda: ready(sock, *(name for name, _ in models)), 60)
        return daemon, sock

    yield start
    for daemon in started:
        daemon.close()


def ready(sock: Path, *models: str) -> bool:
    try:
        with Client(str(sock), timeout=5) as client:
            return all(client.model_ready(model) for model in models)
    except OSError:
        return False


def status(sock: Path) -> dict[str, Any]:
    with Client(str(sock), timeout=30) as client:
        return client.status()


def serving_pid(sock: Path) -> int:
    pid = status(sock)["serving"]["pid"]
    assert isinstance(pid, int)
    return pid


def new_child(daemon: RunningDaemon, sock: Path, old: int, model: str = "demo") -> int:
    """Wait until another serving process answers; returns its pid."""
    found: list[int] = []

    def answered() -> bool:
        if not ready(sock, model):
            return False
        pid = status(sock)["serving"]["pid"]
        if pid in (None, old):
            return False
        found.append(pid)
        return True

    daemon.wait_for(answered, 60)
    return found[-1]


def test_serving_comes_back_after_any_signal_and_the_governor_never_stops(
    served: Callable[..., tuple[RunningDaemon, Path]],
) -> None:
    daemon, sock = served(("demo", MODEL))
    first = status(sock)
    assert first["daemon"]["pid"] == daemon.process.pid
    child = first["serving"]["pid"]
    assert child != daemon.process.pid
    for number, sig in enumerate((signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS), start=1):
        os.kill(child, sig)
        child = new_child(daemon, sock, child)
        doc = status(sock)
        assert doc["daemon"]["pid"] == daemon.process.pid
        assert doc["serving"]["restarts"] == number
        assert doc["serving"]["last_exit"]["reason"] == f"signal {sig.name}"
        with Client(str(sock)) as client:
            scores = client.infer("demo", {"image": __import__("numpy").zeros((1, 3, 64, 64), "f")})
        assert scores["scores"].shape == (1, 10)
    # Governing went on all along: samples kept coming, and the process never left.
    assert daemon.process.poll() is None
    assert status(sock)["loop"]["sample_lateness"] is not None
    log = daemon.log.read_text()
    assert "exited (signal SIGSEGV)" in log and "exited (signal SIGBUS)" in log


def test_a_request_in_flight_when_serving_dies_fails_at_once_and_the_next_one_is_served(
    served: Callable[..., tuple[RunningDaemon, Path]], tmp_path: Path
) -> None:
    import numpy as np

    daemon, sock = served(("slow", slow_model(tmp_path / "slow.onnx")))
    child = serving_pid(sock)
    body = np.ones((1, 1024, 1024), np.float32)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [1, 1024, 1024],
                    "parameters": {"binary_data_size": body.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    connection = http.client.HTTPConnection("localhost", timeout=60)
    connection.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.sock.connect(str(sock))
        connection.request(
            "POST",
            "/v2/models/slow/infer",
            head + body.tobytes(),
            {"Inference-Header-Content-Length": str(len(head))},
        )
        time.sleep(0.5)  # the model is running it now (seconds of work)
        os.kill(child, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            connection.getresponse()
        assert time.monotonic() - started < 10, "the client hung instead of seeing the failure"
    finally:
        connection.close()
    new_child(daemon, sock, child, "slow")


def test_the_socket_outlives_the_serving_process(
    served: Callable[..., tuple[RunningDaemon, Path]],
) -> None:
    """Connections made while serving is down wait in the backlog and are answered by the next
    serving process; none is refused."""
    _, sock = served(("demo", MODEL))
    child = serving_pid(sock)
    os.kill(child, signal.SIGKILL)
    waiting = []
    for _ in range(5):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(60)
        client.connect(str(sock))  # never ECONNREFUSED
        client.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n")
        waiting.append(client)
    for client in waiting:
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
        client.close()
    assert serving_pid(sock) != child


def test_a_crash_loop_is_slowed_reported_and_status_still_answers(
    served: Callable[..., tuple[RunningDaemon, Path]],
) -> None:
    daemon, sock = served(("demo", MODEL))
    child = serving_pid(sock)
    for _ in range(4):  # quick exits: restarts after 0, 0.5, 1, then 2 s
        os.kill(child, signal.SIGKILL)
        child = new_child(daemon, sock, child)
    os.kill(child, signal.SIGKILL)  # the fifth in a row: 4 s until the next start
    daemon.wait_for(lambda: "next start in 4 s" in daemon.log.read_text(), 10)
    # The governor answers meanwhile: status from its own document, everything else 503.
    with Client(str(sock), timeout=10) as client:
        doc = client.status()
        assert doc["serving"]["state"] == "restarting" and doc["serving"]["pid"] is None
        assert doc["temperature_c"] is not None
        reply = client.request("POST", "/v2/models/demo/infer", b"{}")
    assert reply.status == 503 and reply.headers["Retry-After"]
    assert "serving is restarting" in json.loads(reply.body)["error"]
    new_child(daemon, sock, child)


def test_the_governor_process_never_imports_the_serving_stack(tmp_path: Path) -> None:
    """A real board: the simulator in its own process (as the hardware would be), mcpd run
    governing it and serving a model; the governor's own modules are looked at once it serves."""
    board = tmp_path / "board"
    sim = subprocess.Popen(
        [sys.executable, "-m", "mcpd", "sim", "--profile", "rk3588", "--root", str(board)],
        cwd=PROJECT,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (board / "proc/sys/kernel/random/boot_id").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sock, found = tmp_path / "mcpd.sock", tmp_path / "modules.json"
        (tmp_path / "mcpd.toml").write_text(
            f'[daemon]\nsysfs_root = "{board}"\nsocket = "{sock}"\n'
            f'state_dir = "{tmp_path / "state"}"\nruntime_dir = "{tmp_path / "run"}"\n'
            f'[[models]]\nname = "demo"\npath = "{MODEL}"\n'
        )
        script = f"""
import http.client, json, os, signal, socket, sys, threading, time
from mcpd.cli import main

def look():
    while True:
        try:
            c = http.client.HTTPConnection("localhost", timeout=5)
            c.sock = socket.socket(socket.AF_UNIX); c.sock.connect({str(sock)!r})
            c.request("GET", "/v2/models/demo/ready")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    names = sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r})
    open({str(found)!r}, "w").write(json.dumps(names))
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=look, daemon=True).start()
sys.exit(main(["run", "--config", {str(tmp_path / "mcpd.toml")!r}]))
"""
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=PROJECT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(found.read_text()) == []
    finally:
        sim.terminate()
        sim.wait(10)
