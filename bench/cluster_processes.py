"""The processes bench/mqtt_cluster.py watches: who listens on which port and how many clients
each port has, the CPU of each process between marks, and `mcpctl ingest`'s own counters.

    listening, clients = sockets()
    cpu = Cpu({"node0": port, ...}, {"boards": pid}); cpu.mark(); ...; cpu.cores(0)
    counters(metrics_port)              # {"mcpd_ingest_messages_written_total": ..., ...}
    wait_subscribed(node, metrics_port, protocol, user, password)
"""

from __future__ import annotations

import time
import urllib.request

import paho.mqtt.client as paho
import psutil
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families

from mcpd.ctl import paho_thread
from tests.support.engines import LOOPBACK, Node

RECEIVED = "mcpd_ingest_messages_received_total"
SUBSCRIBE_S = 60.0
"""How long the ingest may take to subscribe (NATS creates its JetStream consumer then)."""


def sockets() -> tuple[dict[int, int], dict[int, int]]:
    """(pid listening on each loopback TCP port, established connections to each port)."""
    listening: dict[int, int] = {}
    clients: dict[int, int] = {}
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid is not None:
            listening[c.laddr.port] = c.pid
        elif c.status == psutil.CONN_ESTABLISHED:
            clients[c.laddr.port] = clients.get(c.laddr.port, 0) + 1
    return listening, clients


class Cpu:
    """CPU seconds of named processes (found by the port they listen on) at each mark."""

    def __init__(self, ports: dict[str, int], pids: dict[str, int]) -> None:
        self.ports = ports
        self.pids = pids
        self.marks: list[tuple[float, dict[str, tuple[int, float]]]] = []

    def mark(self) -> None:
        listening, _ = sockets()
        pids = {**{n: listening[p] for n, p in self.ports.items() if p in listening}, **self.pids}
        seconds = {}
        for name, pid in pids.items():
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            seconds[name] = (pid, times.user + times.system)
        self.marks.append((time.time(), seconds))

    def cores(self, i: int) -> dict[str, float]:
        """Cores each process used between mark i and mark i + 1 (one process throughout)."""
        (t0, a), (t1, b) = self.marks[i], self.marks[i + 1]
        return {
            n: round((b[n][1] - a[n][1]) / (t1 - t0), 3) for n in a if n in b and a[n][0] == b[n][0]
        }


def counters(port: int) -> dict[str, float]:
    """`mcpctl ingest`'s own counters, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("mcpd_ingest_") and not s.labels
    }


def wait_subscribed(node: Node, metrics: int, protocol: str, user: str, password: str) -> None:
    """Until `mcpctl ingest` takes messages: a probe status (not telemetry: nothing is stored)
    is published on `node` every 0.5 s until the ingest's received counter moves. Boards started
    before that would publish messages the ingest never subscribed to, which the store would
    then lack (on NATS, the first messages of every board)."""
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        protocol=paho.MQTTv5 if protocol == "5" else paho.MQTTv311,
    )
    client.username_pw_set(user, password)
    client.connect(LOOPBACK, node.port)
    client.loop_start()
    deadline = time.monotonic() + SUBSCRIBE_S
    try:
        while not _received(metrics):
            if time.monotonic() > deadline:
                raise RuntimeError(f"mcpctl ingest took nothing within {SUBSCRIBE_S:g} s")
            client.publish("mcpd/bench-probe/status", b"probe", qos=1)
            time.sleep(0.5)
    finally:
        paho_thread.close(client)


def _received(metrics: int) -> float:
    try:
        return counters(metrics).get(RECEIVED, 0.0)
    except OSError:  # its /metrics not listening yet
        return 0.0
