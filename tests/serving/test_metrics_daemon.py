"""/metrics of a running daemon on a simulated board, on its Unix socket and on `[metrics] listen`,
read with prometheus_client's parser and held against the status document it comes from."""

from __future__ import annotations

import http.client
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from mcpd.client import Client
from mcpd.demo import MODEL
from tests.support.daemon import RunningDaemon, models_ready, new_child, serving_pid
from tests.support.mqtt_broker import free_port

REQUESTS = 5


def get(port: int, path: str, **headers: str) -> tuple[int, dict[str, str], str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", path, headers=headers)
        reply = connection.getresponse()
        return reply.status, dict(reply.headers), reply.read().decode()
    finally:
        connection.close()


def families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family: Metric, **labels: str) -> float:
    (found,) = [s.value for s in family.samples if s.labels == labels]
    return found


def sampled(family: Metric, **labels: str) -> float | None:
    """The sample's value; None where there is none (what a null in the status becomes)."""
    found = [s.value for s in family.samples if s.labels == labels]
    assert len(found) <= 1
    return found[0] if found else None


def demo_daemon(tmp_path: Path) -> tuple[RunningDaemon, Path, int]:
    """The daemon with the demo model (batches up to 4) and `[metrics] listen` on a free port,
    once the model is ready: the daemon, its socket and the port."""
    sock, port = tmp_path / "mcpd.sock", free_port()
    running = RunningDaemon(
        tmp_path,
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
        f'[[models]]\nname = "demo"\npath = "{MODEL}"\nmax_batch = 4\n',
    )
    try:
        running.wait_for(lambda: models_ready(sock, "demo"), 60)
    except BaseException:
        running.close()
        raise
    return running, sock, port


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, Path, int]]:
    running, sock, port = demo_daemon(tmp_path_factory.mktemp("metrics"))
    try:
        with Client(str(sock), timeout=30) as client:
            for _ in range(REQUESTS):
                client.infer("demo", {"image": np.zeros((1, 3, 64, 64), np.float32)})
        yield running, sock, port
    finally:
        running.close()


def consistent_scrape(sock: Path) -> tuple[dict[str, Any], str]:
    """A scrape and the status document it was made from: the document before and after the
    scrape is the same one (the governor refreshes it a few times a second)."""
    with Client(str(sock), timeout=30) as client:
        for _ in range(50):
            before = client.status()
            text = client.metrics()
            if client.status() == before:
                return before, text
    raise AssertionError("the status document changed during every scrape")


def test_the_socket_scrape_matches_the_status_document(
    daemon: tuple[RunningDaemon, Path, int],
) -> None:
    _, sock, _ = daemon
    document, text = consistent_scrape(sock)
    found = families(text)
    assert sampled(found["mcpd_temperature_celsius"]) == document["temperature_c"]
    for name, celsius in document["temperatures"].items():
        assert sampled(found["mcpd_sensor_temperature_celsius"], sensor=name) == celsius
    # RK3588 has no power meter: no power at all, or an estimate (issue 15), labelled so.
    power = [(s.labels, s.value) for s in found["mcpd_power_watts"].samples]
    if document["power_w"] is None:
        assert power == []
    else:
        assert power == [({"estimated": "true"}, document["power_w"])]
    assert document["domains"]  # three CPU clusters, GPU, NPU
    for name, domain in document["domains"].items():
        labels = {"domain": name, "kind": domain["kind"]}
        for metric, key in (("cap", "cap_mhz"), ("target", "target_mhz"), ("max", "max_mhz")):
            hertz = sampled(found[f"mcpd_domain_{metric}_hertz"], **labels)
            want = None if domain[key] is None else pytest.approx(domain[key] * 1e6)
            assert hertz == want, (name, metric)
    states = {s.labels["state"]: s.value for s in found["mcpd_governor_state"].samples}
    assert states[document["governor"]["state"]] == 1 and sum(states.values()) == 1
    assert value(found["mcpd_batch_size"], model="demo") == document["batch"]["demo"]
    inference = document["inference"]["demo"]
    assert value(found["mcpd_inference_requests"], model="demo") == inference["requests"]
    assert inference["requests"] == REQUESTS
    assert value(found["mcpd_inference_errors"], model="demo") == 0
    assert value(found["mcpd_model_ready"], model="demo") == 1
    assert found["mcpd_inference_requests"].type == "counter"
    assert value(found["mcpd_serving_restarts"]) == document["serving"]["restarts"] == 0
    for phase in ("request", "queue", "compute"):
        histogram = found[f"mcpd_inference_{phase}_duration_seconds"]
        assert histogram.type == "histogram"
        samples = [s for s in histogram.samples if s.labels.get("model") == "demo"]
        counts = [s.value for s in samples if s.name.endswith("_bucket")]
        assert len(counts) == 15 and counts == sorted(counts)  # cumulative, up to +Inf
        assert counts[-1] == REQUESTS
        (total,) = [s.value for s in samples if s.name.endswith("_count")]
        assert total == REQUESTS


def test_the_tcp_port_serves_the_same_metrics_and_nothing_else(
    daemon: tuple[RunningDaemon, Path, int],
) -> None:
    _, sock, port = daemon
    status, headers, text = get(port, "/metrics")
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    with Client(str(sock), timeout=30) as client:
        over_socket = families(client.metrics())
    assert families(text).keys() == over_socket.keys()
    assert value(families(text)["mcpd_inference_requests"], model="demo") == REQUESTS
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    status, headers, text = get(port, "/metrics", Accept=accept)
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert text.endswith("# EOF\n")
    for path in ("/v2/mcpd/status", "/v2/models/demo", "/v2/health/live"):
        assert get(port, path)[0] == 404, path


def test_a_scrape_during_a_serving_restart_waits_and_is_answered(
    daemon: tuple[RunningDaemon, Path, int],
) -> None:
    running, sock, port = daemon
    with Client(str(sock), timeout=30) as client:
        child = client.status()["serving"]["pid"]
    os.kill(child, signal.SIGKILL)
    status, _, _ = get(port, "/metrics")  # in the backlog until the next serving process
    assert status == 200

    def restart_counted() -> bool:  # once the governor's next status refresh has it
        return value(families(get(port, "/metrics")[2])["mcpd_serving_restarts"]) == 1

    running.wait_for(restart_counted, 10)
    assert "exited (signal SIGKILL)" in running.log.read_text()


def test_during_a_crash_loop_a_scrape_gets_503_from_the_governor(tmp_path: Path) -> None:
    running, sock, port = demo_daemon(tmp_path)
    try:
        child = serving_pid(sock)
        for _ in range(4):  # quick exits: restarts after 0, 0.5, 1, then 2 s
            os.kill(child, signal.SIGKILL)
            child = new_child(running, sock, child)
        os.kill(child, signal.SIGKILL)  # the fifth in a row: 4 s until the next start
        running.wait_for(lambda: "next start in 4 s" in running.log.read_text(), 10)
        status, headers, body = get(port, "/metrics")
        assert status == 503 and headers["Retry-After"]
        assert "serving is restarting" in body and "SIGKILL" in body
        assert get(port, "/v2/mcpd/status")[0] == 404  # the socket's status is not on this port
        new_child(running, sock, child)
        assert get(port, "/metrics")[0] == 200  # the next serving process answers it again
    finally:
        running.close()
