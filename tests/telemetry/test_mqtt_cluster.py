"""Boards on a real broker cluster that loses a node: a 3-node ejabberd cluster behind haproxy
(MQTT 5) and a 3-node NATS cluster (MQTT 3.1.1), from their Debian packages (tests/support/mqtt_clusters.py).

Boards are mcpd's own Publisher (as bench/mqtt_fleet.py runs them), half on `[mqtt] brokers`
(each in its own order over the nodes) and half behind haproxy where there is one, plus one real
daemon on a simulated board connected to the node that is killed. A consumer and `mcpctl fleet
--json` follow them from a node that stays. Then the daemon and its node are killed with kill -9
at the same moment, as a rack that loses power: no seq gap in what the consumer received and
nothing twice but what QoS 1 allows (in flight at the loss), every other board publishing again
within 10 s (NATS: its own stall, and then one backoff), and the dead board `offline` in `mcpctl
fleet` within 3 x heartbeat_s although its Will never comes (the node that held it is gone);
with MQTT 5, its retained `online` has expired when its node comes back.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcpd.brokers import order
from mcpd.brokers import parse as parse_broker
from mcpd.telemetry.mqtt_client import WINDOW
from tests.conftest import PROJECT
from tests.support.daemon import DaemonProcess, simulated
from tests.support.engines import Haproxy, Node, missing
from tests.support.mqtt_broker import Received, Recorder, publishing, recording, settings
from tests.support.mqtt_clusters import EjabberdCluster, NatsCluster
from tests.support.waiting import wait_until

HEARTBEAT_S = 1
BOARDS = 6
"""Boards on the broker list, and as many again behind haproxy."""
USER, PASSWORD = "mcpd", "fleet-secret"
VICTIM = "victim"
KEPT = "mcpd-test/kept"


@dataclass(frozen=True)
class Cluster:
    nodes: list[Node]
    kill: Callable[[int], None]
    start: Callable[[int], None]
    front: Node | None
    """A balancer in front of the nodes, if any."""
    protocol: str
    reconnect_s: float
    """Every board is heard from again within this after the kill."""
    undisturbed_s: float | None
    """The longest silence of a board on a node that stays, unless the cluster dropped it (its
    Will was sent); None where the cluster stalls every client."""


@pytest.fixture(scope="module")
def ejabberd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = missing("ejabberdctl", "haproxy")
    if reason:
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.skip("ejabberdctl runs ejabberd only as root (which hands it to the ejabberd user)")
    folder = tmp_path_factory.mktemp("ejabberd")
    with (
        EjabberdCluster(3, users={USER: PASSWORD}, keep=folder / "logs") as cluster,
        Haproxy(folder / "haproxy", [n.port for n in cluster.nodes]) as lb,
    ):
        # Issue 29: every board publishing again within 10 s; the others undisturbed.
        front = Node("haproxy", lb.port)
        yield Cluster(cluster.nodes, cluster.kill, cluster.start_node, front, "5", 10.0, 2.0)


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = missing("nats-server")
    if reason:
        pytest.skip(reason)
    with NatsCluster(tmp_path_factory.mktemp("nats"), 3) as cluster:
        # NATS 2.9.10 stalls every MQTT client while JetStream elects new leaders for the streams
        # that hold MQTT's state (when the killed node led some): up to 13.1 s in 12 runs here
        # (the boards of the dead node: the stall, then one backoff of reconnect_max_s = 2).
        yield Cluster(cluster.nodes, cluster.kill, cluster.start_node, None, "3.1.1", 20.0, None)


class Fleet:
    """`mcpctl fleet --json` in its own process, its snapshots kept as they come."""

    def __init__(self, node: Node, protocol: str, password_file: Path) -> None:
        command = [
            sys.executable,
            "-c",
            "import sys; from mcpd.ctl import main; sys.exit(main())",
            "fleet",
            "--broker",
            node.address,
            "--protocol",
            protocol,
            "--username",
            USER,
            "--password-file",
            str(password_file),
            "--heartbeat",
            str(HEARTBEAT_S),
            "--interval",
            "0.25",
            "--json",
        ]
        self.snapshots: list[dict[str, Any]] = []
        self._process = subprocess.Popen(command, cwd=PROJECT, stdout=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.snapshots.append(json.loads(line))

    def online(self, device: str) -> list[tuple[float, bool | None]]:
        """(ts, online) of `device` in each snapshot that lists it."""
        return [
            (s["ts"], d["online"])
            for s in self.snapshots
            for d in s["devices"]
            if d["device"] == device
        ]

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)
        self._reader.join(10)
        if self._process.stdout is not None:
            self._process.stdout.close()


@contextmanager
def daemon(
    tmp_path: Path, node: Node, protocol: str, password_file: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """The real daemon on a simulated Jetson Orin Nano, on the one node that is killed."""
    config = tmp_path / "victim.toml"
    config.write_text(
        "[mqtt]\nenabled = true\n"
        f'device_id = "{VICTIM}"\nbrokers = ["{node.address}"]\nprotocol = "{protocol}"\n'
        f'username = "{USER}"\npassword_file = "{password_file}"\n'
        f"telemetry_ms = 200\nheartbeat_s = {HEARTBEAT_S}\nreconnect_max_s = 2\n"
    )
    board = simulated("jetson-orin-nano", tmp_path / "victim")
    with DaemonProcess(config, *board, log=tmp_path / "victim.log") as victim:
        yield victim.process


def telemetry(messages: list[Received]) -> dict[str, list[Received]]:
    by_device: dict[str, list[Received]] = {}
    for message in messages:
        if message.topic.endswith("/telemetry"):
            by_device.setdefault(message.topic.split("/")[1], []).append(message)
    return by_device


def node_loss(cluster: Cluster, tmp_path: Path) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")
    listed = [n.address for n in cluster.nodes]
    survivor = cluster.nodes[0]
    # The node killed is the one of the others that the most listed boards start on.
    addresses = tuple(parse_broker(address) for address in listed)
    firsts = [order(addresses, f"list{i}")[0].port for i in range(BOARDS)]
    killed = max((1, 2), key=lambda i: firsts.count(cluster.nodes[i].port))
    victim_node = cluster.nodes[killed]
    common = {
        "protocol": cluster.protocol,
        "username": USER,
        "password_file": str(password_file),
        "heartbeat_s": HEARTBEAT_S,
        "reconnect_max_s": 2,
    }
    boards = [(f"list{i}", settings(survivor, brokers=listed, **common)) for i in range(BOARDS)]
    if cluster.front is not None:
        front = settings(cluster.front, host="127.0.0.1", port=cluster.front.port, **common)
        boards += [(f"lb{i}", front) for i in range(BOARDS)]
    with ExitStack() as stack:
        # A persistent session (3.1.1: clean session off), so that a consumer the cluster drops
        # (NATS drops every MQTT client while JetStream elects new leaders) gets what it missed.
        consumer = Recorder(
            survivor,
            "mcpd/+/telemetry",
            "mcpd/+/status",
            session=f"mcpd-consumer-{cluster.protocol}",
            protocol=cluster.protocol,
            username=USER,
            password=PASSWORD,
        )
        stack.callback(consumer.close)
        victim = stack.enter_context(daemon(tmp_path, victim_node, cluster.protocol, password_file))
        publishers = {
            device: stack.enter_context(publishing(mqtt, tmp_path / device, device))
            for device, mqtt in boards
        }
        devices = [*publishers, VICTIM]
        consumer.wait(
            lambda ms: all(len(telemetry(ms).get(d, [])) >= 3 for d in devices), timeout=40
        )
        # Started after the boards: on ejabberd, retained messages do not cross nodes, so it learns
        # that the daemon on another node is online from the daemon's next heartbeat.
        fleet = Fleet(survivor, cluster.protocol, password_file)
        stack.callback(fleet.close)
        wait_until(
            lambda: (fleet.online(VICTIM) or [(0, None)])[-1][1] is True,
            HEARTBEAT_S + 10,
            "the board online in mcpctl fleet",
        )
        on_victim_node = [
            d for d, p in publishers.items() if p.connection["broker"] == victim_node.address
        ]
        # A retained message without expiry, to tell "expired" from "lost with the node" below.
        if cluster.protocol == "5":
            with recording(victim_node, KEPT, **login(cluster)) as control:
                control.client.publish(KEPT, b"kept", qos=1, retain=True).wait_for_publish(10)
        # The board and its node die together, and the node first: a board killed first closes
        # its socket, and a node that outlives it by a few milliseconds sends its Will (a CI run
        # of 32a0682). Stopped, the board holds its connection open and cannot reconnect.
        killed_at = time.time()
        victim.send_signal(signal.SIGSTOP)
        cluster.kill(killed)
        victim.send_signal(signal.SIGKILL)
        wait_until(
            lambda: (fleet.online(VICTIM) or [(0, None)])[-1][1] is False,
            3 * HEARTBEAT_S + 10,
            "the dead board offline in mcpctl fleet",
        )
        offline_at = next(
            ts for ts, online in fleet.online(VICTIM) if ts > killed_at and online is False
        )

        def again(ms: list[Received]) -> bool:
            by_device = telemetry(ms)
            return all(by_device[d][-1].json()["ts"] > killed_at + 1 for d in publishers)

        consumer.wait(again, timeout=30)

        def settled_fleet() -> bool:
            latest = {d["device"]: d["online"] for d in fleet.snapshots[-1]["devices"]}
            return latest.get(VICTIM) is False and all(latest.get(d) for d in publishers)

        # The others are online again, by their heartbeats, and the dead board stays offline.
        wait_until(settled_fleet, 10, "the others online and the dead board offline")
        stopped_at = time.time()
        reconnected = {d for d, p in publishers.items() if (p.connection["since"] or 0) > killed_at}
        for publisher in publishers.values():  # clean stops: each flushes what it spooled
            publisher.stop()
        settled = len(consumer.messages)
        while True:
            time.sleep(1.0)
            if len(consumer.messages) == settled:
                break
            settled = len(consumer.messages)
        if cluster.protocol == "5":
            cluster.start(killed)  # the dead board's node comes back; the board does not
            # Its retained messages are kept on disk (ejabberd keeps them on the node they were
            # published on), but the board's `online` has expired. (NATS, MQTT 3.1.1, has no
            # expiry; and after losing a node it gave a new subscriber all, some or none of the
            # retained messages within 15 s, run to run.) Once in five full runs here, ejabberd
            # restarting the node sent the dead session's Will, a retained `offline`: true of the
            # board, and no `online` either way.
            retained = retained_on(cluster.nodes[killed], cluster)
            assert retained.pop(f"mcpd/{VICTIM}/status", b"offline") == b"offline"
            assert retained == {KEPT: b"kept"}
    report(cluster, consumer.messages, (killed_at, stopped_at), offline_at, reconnected)
    assert on_victim_node and set(on_victim_node) <= reconnected, on_victim_node


def login(cluster: Cluster) -> dict[str, str]:
    return {"protocol": cluster.protocol, "username": USER, "password": PASSWORD}


def retained_on(node: Node, cluster: Cluster) -> dict[str, bytes]:
    """The retained messages a new subscriber on `node` gets for the dead board's status and the
    kept message (one SUBSCRIBE: its filters answered in order)."""
    status = f"mcpd/{VICTIM}/status"
    with recording(node, status, KEPT, **login(cluster)) as recorder:
        recorder.wait_for(KEPT, timeout=15)
        return {m.topic: m.payload for m in recorder.messages if m.retain}


def report(
    cluster: Cluster,
    messages: list[Received],
    run: tuple[float, float],
    offline_at: float,
    reconnected: set[str],
) -> None:
    killed_at, stopped_at = run
    by_device = telemetry(messages)
    seqs = {d: [m.json()["seq"] for m in ms] for d, ms in by_device.items()}
    gaps = {d: max(s) - min(s) + 1 - len(set(s)) for d, s in seqs.items()}
    twice = {d: sorted(seq for seq in set(s) if s.count(seq) > 1) for d, s in seqs.items()}
    silences = {
        d: max(b.at - a.at for a, b in itertools.pairwise(ms)) for d, ms in by_device.items()
    }
    wills = sorted(
        m.topic.split("/")[1]
        for m in messages
        if m.topic.endswith("/status") and m.payload == b"offline" and killed_at < m.at < stopped_at
    )
    print(
        f"\n{cluster.protocol}: {sum(map(len, seqs.values()))} messages from {len(seqs)} boards; "
        f"gaps {sum(gaps.values())}, received twice { {d: s for d, s in twice.items() if s} }; "
        f"reconnected: {sorted(reconnected)}; "
        "longest silence per board: "
        f"{ {d: round(s, 2) for d, s in sorted(silences.items())} }; offline in mcpctl fleet "
        f"{offline_at - killed_at:.2f} s after the kill; Wills (offline) after the kill: {wills}"
    )
    assert VICTIM not in wills  # its node died with it: no Will
    assert gaps == dict.fromkeys(seqs, 0)
    # QoS 1 is at least once: a message the dead node had passed on but not yet acknowledged is
    # sent again by its board on the new connection (NATS, 1 run in 8 here). Only boards that
    # reconnected, only what was in flight (mqtt_client.WINDOW) when the node died; a consumer
    # keeps one by (device, seq), as `mcpctl ingest` does.
    for device, seqs_twice in twice.items():
        made = [m.json()["ts"] for m in by_device[device] if m.json()["seq"] in seqs_twice]
        assert not seqs_twice or device in reconnected, (device, seqs_twice)
        assert len(seqs_twice) <= WINDOW and all(ts < killed_at + 1 for ts in made), made
    others = {d: s for d, s in silences.items() if d != VICTIM}
    assert max(others.values()) <= cluster.reconnect_s, others
    if cluster.undisturbed_s is not None:
        # ejabberd 23.01 itself drops a session that publishes at the instant a node dies, and
        # sends its Will: such a board reconnects like those of the dead node.
        stayed = [d for d in others if d.startswith("list") and d not in reconnected]
        assert all(silences[d] <= cluster.undisturbed_s for d in stayed), silences
    assert offline_at - killed_at <= 3 * HEARTBEAT_S + 1.0  # + one snapshot interval and more


def test_ejabberd_cluster_behind_haproxy_loses_a_node(ejabberd: Cluster, tmp_path: Path) -> None:
    node_loss(ejabberd, tmp_path)


def test_nats_cluster_loses_a_node(nats: Cluster, tmp_path: Path) -> None:
    node_loss(nats, tmp_path)
