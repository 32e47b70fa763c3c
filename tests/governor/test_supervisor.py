"""The governor and the serving process: serving dies of anything, the governor keeps governing,
restarts it, keeps its socket, slows a crash loop down and answers status meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcpd import channel
from mcpd.channel import Channel
from mcpd.client import Client
from mcpd.config import Config, parse
from mcpd.demo import MODEL
from mcpd.events import EventBus
from mcpd.governor.config_delivery import RESEND_S, ConfigDelivery
from mcpd.governor.serving_reports import ServingReports
from mcpd.governor.supervisor import ServingSupervisor
from mcpd.status import inference
from tests.conftest import PROJECT
from tests.support.daemon import RunningDaemon, models_ready, new_child, serving_pid, status
from tests.support.mqtt_status import placement
from tests.support.waiting import wait_until

# pydantic (18 MB), psutil (2.7 MB) and prometheus_client (10.4 MB, docs/metrics.md) of a 40 MB
# budget (BENCHMARKS.md): mcpd.schema checks the config, mcpd.status reads /proc itself, and the
# serving process renders /metrics.
FORBIDDEN = (
    "numpy",
    "onnxruntime",
    "openvino",
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
        daemon.wait_for(lambda: models_ready(sock, *(name for name, _ in models)), 60)
        return daemon, sock

    yield start
    for daemon in started:
        daemon.close()


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
        boot_id = board / "proc/sys/kernel/random/boot_id"
        wait_until(boot_id.exists, 30, "the simulated board")
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


def test_a_configuration_larger_than_a_datagram_reaches_serving_whole(tmp_path: Path) -> None:
    """250 models with 1 000-character paths: about 400 KB of configuration, more than one
    datagram of the socket pair holds (it was dropped, and serving waited for it 30 s, exited,
    and was started again, answering nothing). It crosses whole: the last model is known to
    serving, and the governor has its acknowledgement."""
    sock = tmp_path / "mcpd.sock"
    missing = "/nonexistent/" + "d/" * 490
    config = f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n'
    config += f'[[models]]\nname = "demo"\npath = "{MODEL}"\n'
    config += "".join(
        f'[[models]]\nname = "m{i}"\npath = "{missing}m{i}.onnx"\n' for i in range(249)
    )
    daemon = RunningDaemon(tmp_path, config)
    try:
        daemon.wait_for(lambda: models_ready(sock, "demo"), 60)
        doc = status(sock)
        assert "m248" in doc["inference"]
        assert doc["serving"]["config_error"] is None
        assert doc["inference"]["m248"]["ready"] is False
    finally:
        daemon.close()


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Callable[[Config], ServingSupervisor]]:
    """The governor's side in this process, with a real serving process."""
    started: list[ServingSupervisor] = []

    def start(config: Config) -> ServingSupervisor:
        running = ServingSupervisor(
            config,
            lambda: {"serving": running.info()},  # type: ignore[typeddict-item]
            dict,
            EventBus(),
            placement=lambda config: placement(),
        )
        asyncio.run(running.start())
        started.append(running)
        return running

    yield start
    for running in started:
        asyncio.run(running.stop())


@pytest.mark.parametrize("failure", ["too big to send", "refused by serving"])
def test_a_configuration_serving_cannot_take_is_said_and_the_socket_still_answers(
    supervisor: Callable[[Config], ServingSupervisor],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    """The serving process is stopped at once rather than left waiting 30 s for a configuration
    (answering nothing, then started again at once as if it had served): the crash-loop delay
    follows, and meanwhile the stand-in answers liveness and a status that says why."""
    sock = tmp_path / "mcpd.sock"
    config = parse({"daemon": {"socket": str(sock), "state_dir": str(tmp_path / "state")}})
    if failure == "too big to send":
        monkeypatch.setattr(channel, "MESSAGE_BYTES", 1000)
        expected = r"configuration \d+ not sent: a config message of \d+ bytes is too big"
    else:  # what the governor's checks let through and serving's refuse (another version)
        daemon = dataclasses.replace(config.daemon, max_connections=0)
        config = dataclasses.replace(config, daemon=daemon)
        expected = r"the serving process refused configuration \d+: <from the governor>: " \
                   r"daemon.max_connections: expected greater than or equal to 1, got 0"  # fmt: skip
    running = supervisor(config)
    with Client(str(sock), timeout=20) as client:
        assert client.live()
    with Client(str(sock), timeout=20) as client:
        serving = client.status()["serving"]
    assert serving["state"] == "restarting" and re.match(expected, serving["config_error"])
    assert running.restarts >= 2


def test_a_configuration_is_sent_again_until_serving_acknowledges_it() -> None:
    """Taken by the channel is not yet taken by serving (a memfd it had no descriptor for is
    dropped by the kernel): the configuration goes again every RESEND_S until acknowledged."""
    now = 100.0
    delivery = ConfigDelivery(lambda error: None)
    governor, theirs = Channel.pair()
    serving = Channel(theirs)
    try:
        delivery.send(parse({}), {}, placement(), governor, now)
        (first,) = serving.receive() or [None]
        assert first is not None and first["kind"] == "config" and first["generation"] == 1
        now += RESEND_S - 0.1
        delivery.deliver(governor, now)
        assert serving.receive() == []
        now += 0.1
        delivery.deliver(governor, now)
        assert serving.receive() == [first]
        serving.send({"kind": "configured", "generation": 1, "error": None})
        ServingReports(EventBus(), delivery).take(governor.receive() or [])
        now += RESEND_S
        delivery.deliver(governor, now)
        assert serving.receive() == [] and delivery.error is None
    finally:
        governor.close()
        serving.close()


def test_statistics_of_the_wrong_type_are_refused_and_the_status_is_still_built() -> None:
    """A serving process taken over by a client sent its p50 as a string: the governor kept it, and
    from then on every status document it built failed (round() of a str), so every step of the
    supervisor failed before it read serving's next message or reaped it (a traceback every 50 ms,
    serving never restarted) and telemetry skipped every sample. The message is refused whole; the
    statistics sent before it stay."""
    governor, theirs = Channel.pair()
    serving = Channel(theirs)
    reports = ServingReports(EventBus(), ConfigDelivery(lambda error: None))
    good = {"ready": True, "requests": 3, "errors": 0, "p50_ms": 1.5, "p99_ms": 2.0,
            "queue_depth": 0, "detail": {}, "statistics": None, "latency": None}  # fmt: skip
    try:
        serving.sock.send(json.dumps({"kind": "stats", "models": {"m": good}}).encode())
        reports.take(governor.receive() or [])
        serving.sock.send(
            json.dumps({"kind": "stats", "models": {"m": {**good, "p50_ms": "fast"}}}).encode()
        )
        reports.take(governor.receive() or [])
    finally:
        governor.close()
        serving.close()
    assert inference(reports.stats)["m"]["p50_ms"] == 1.5


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = (Path("/proc") / entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_background_build_dies_with_the_serving_process_that_started_it(tmp_path: Path) -> None:
    """A serving process killed during an `optimize` build left the build running, reparented
    to init until it next wrote to its closed pipe (three kills, three builds at once). Now the
    build is gone before the next serving process answers, and that one removes the build's
    scratch folder (its half-made output and temporary files)."""
    import numpy as np

    model = slow_model(tmp_path / "slow.onnx")  # its first inference alone takes seconds
    samples = tmp_path / "samples"
    samples.mkdir()
    for index in range(2):
        np.save(samples / f"s{index}.npy", np.ones((1024, 1024), np.float32))
    sock, state = tmp_path / "mcpd.sock", tmp_path / "state"
    daemon = RunningDaemon(
        tmp_path,
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{state}"\n'
        f'[[models]]\nname = "slow"\npath = "{model}"\noptimize = "fp32"\n'
        f'calibration = "{samples}"\n'
        '[models.onnxruntime]\ngraph_optimization_level = "disable"\n',  # quick to load
    )
    builds: list[int] = []
    try:
        daemon.wait_for(lambda: models_ready(sock, "slow"), 60)
        child = serving_pid(sock)
        daemon.wait_for(lambda: bool(builds.extend(_children(child)) or builds), 60)
        os.kill(child, signal.SIGKILL)
        left = list((state / "optimized").glob(f".*.{child}.tmp"))
        new_child(daemon, sock, child, "slow")
        assert not [pid for pid in builds if _running(pid)]
        assert len(left) == 1 and not left[0].exists()
    finally:
        for pid in builds:  # a build the fix did not stop must not run on for minutes
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        daemon.close()
