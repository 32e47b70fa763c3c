"""Clustered MQTT brokers for the tests and the benchmarks, from their Debian packages (tests/run
installs them), on free loopback ports: ejabberd (MQTT 5) and NATS (MQTT 3.1.1 only). The process
machinery, the balancer and the stores are in tests/support/engines.py.

    with EjabberdCluster(3, users={"mcpd": "secret"}) as cluster:
        cluster.nodes[0].port            # each node: .name, .port, .address, .tls (None)
        cluster.kill(2)                  # kill -9 one node
        cluster.start_node(2)            # and start it again: it rejoins the cluster
    with NatsCluster(tmp_path, 3) as cluster: ...
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from contextlib import suppress
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from mcpd.ctl import paho_thread
from tests.support.engines import (
    LOOPBACK,
    START_S,
    Engine,
    EngineError,
    Node,
    Process,
    answers,
    binary,
    listening,
)
from tests.support.mqtt_broker import free_port


class EjabberdCluster(Engine):
    """`size` ejabberd 23.01 nodes joined in one cluster (Mnesia), each with mod_mqtt (MQTT 5) on
    a port of its own, and `users` registered (ejabberd's MQTT takes registered users only).

    Each node is started with `ejabberdctl foreground`, which runs the Erlang VM as the ejabberd
    user (ejabberdctl refuses any other user but root) with a ctl config of our own: Debian's
    /etc/ejabberd/ejabberdctl.cfg sets EJABBERD_CONFIG_PATH, which would override --config. The
    folder is a fresh one under the system's temporary folder, owned by the ejabberd user (pytest's
    folders are private to the user that runs it)."""

    def __init__(
        self, size: int = 3, users: dict[str, str] | None = None, keep: Path | None = None
    ) -> None:
        """`keep`: a folder the logs are copied to at the end."""
        self.size = size
        self.users = users or {}
        self.keep = keep
        self.folder = Path(tempfile.mkdtemp(prefix="mcpd-ejabberd-"))
        owner = pwd.getpwnam("ejabberd")
        tag = f"mcpd{os.getpid()}x{self.folder.name.rsplit('-', 1)[-1].lower()}"
        self.nodes = [Node(f"{tag}n{i}@localhost", free_port()) for i in range(size)]
        self._processes: list[Process] = []
        for i, node in enumerate(self.nodes):
            spool = self.folder / f"spool{i}"
            spool.mkdir()
            (self.folder / f"ejabberd{i}.yml").write_text(
                "hosts: [localhost]\n"
                "loglevel: warning\n"
                "auth_method: [internal]\n"
                f"listen:\n  - port: {node.port}\n    ip: {LOOPBACK}\n    module: mod_mqtt\n"
                "modules:\n  mod_mqtt: {}\n"
            )
            (self.folder / f"ctl{i}.cfg").write_text(
                f"ERLANG_NODE={node.name}\n"
                f"INET_DIST_INTERFACE={LOOPBACK}\n"
                f"EJABBERD_CONFIG_PATH={self.folder}/ejabberd{i}.yml\n"
                f"EJABBERD_PID_PATH={spool}/pid\n"
                'ERL_OPTIONS="-env ERL_CRASH_DUMP_BYTES 0"\n'
            )
            self._processes.append(
                Process(node.name, self._ctl(i, "foreground"), self.folder / f"node{i}.log")
            )
        for path in [self.folder, *self.folder.iterdir()]:
            os.chown(path, owner.pw_uid, owner.pw_gid)

    def _ctl(self, i: int, *command: str) -> list[str]:
        ctl = binary("ejabberdctl") or "ejabberdctl"
        return [
            ctl,
            "--ctl-config",
            str(self.folder / f"ctl{i}.cfg"),
            "--spool",
            str(self.folder / f"spool{i}"),
            "--logs",
            str(self.folder / f"spool{i}"),
            *command,
        ]

    def ctl(self, i: int, *command: str) -> str:
        """An ejabberdctl command on node `i` (join_cluster, register, list_cluster, …)."""
        done = subprocess.run(self._ctl(i, *command), capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise EngineError(f"ejabberdctl {' '.join(command)}: {done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> None:
        for i in range(self.size):
            self._processes[i].start()
        for i, node in enumerate(self.nodes):
            self._processes[i].wait_until(lambda node=node: listening(node.port))
        for i in range(1, self.size):
            self.ctl(i, "join_cluster", self.nodes[0].name)
            self._processes[i].wait_until(lambda i=i: listening(self.nodes[i].port))
        for user, password in self.users.items():
            self.ctl(0, "register", user, "localhost", password)

    def start_node(self, i: int) -> None:
        """Start node `i` again after a kill: it rejoins the cluster from its own spool."""
        deadline = time.monotonic() + START_S
        while self.nodes[i].name.split("@")[0] in _epmd_names():  # ejabberdctl refuses it then
            if time.monotonic() > deadline:
                raise EngineError(f"{self.nodes[i].name} still registered with epmd")
            time.sleep(0.1)
        self._processes[i].start()
        self._processes[i].wait_until(lambda: listening(self.nodes[i].port))

    def pid(self, i: int) -> int:
        return int((self.folder / f"spool{i}" / "pid").read_text())

    def kill(self, i: int) -> None:
        """kill -9 node `i`'s Erlang VM, as a machine that dies would leave it."""
        os.kill(self.pid(i), signal.SIGKILL)
        process = self._processes[i].process
        if process is not None:
            process.wait(timeout=10)
        self._processes[i].process = None

    def alive(self, i: int) -> bool:
        return self._processes[i].alive

    def log_text(self) -> str:
        return "\n".join(p.tail() for p in self._processes)

    def stop(self) -> None:
        for i, process in enumerate(self._processes):
            if process.alive:
                with suppress(OSError, ValueError):  # no pid file yet: Popen's kill will do
                    os.kill(self.pid(i), signal.SIGKILL)
            process.stop(signal.SIGKILL)
        # As `ejabberdctl stopped` does: the port mapper goes when no node uses it any more (it
        # forgets a killed node when it notices the closed connection).
        ours = {node.name.split("@")[0] for node in self.nodes}
        deadline = time.monotonic() + 5
        while _epmd_names() & ours and time.monotonic() < deadline:
            time.sleep(0.05)
        epmd = binary("epmd")
        if epmd is not None and not _epmd_names():
            subprocess.run([epmd, "-kill"], capture_output=True, timeout=10)
        if self.keep is not None:
            self.keep.mkdir(parents=True, exist_ok=True)
            for log in self.folder.glob("node*.log"):
                shutil.copy(log, self.keep)
            for i in range(self.size):
                for log in (self.folder / f"spool{i}").glob("*.log"):
                    shutil.copy(log, self.keep / f"{i}-{log.name}")
        shutil.rmtree(self.folder, ignore_errors=True)


def _subscribed(node: Node, topic: str, timeout: float) -> None:
    """Connect (MQTT 3.1.1) and subscribe at QoS 1 once, within `timeout`."""
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    acknowledged = threading.Event()
    client.on_connect = lambda c, *_: c.subscribe(topic, 1)
    client.on_subscribe = lambda *_: acknowledged.set()
    client.connect(LOOPBACK, node.port)
    client.loop_start()
    try:
        if not acknowledged.wait(timeout):
            raise EngineError(f"{node.name}: no SUBACK within {timeout:g} s")
    finally:
        paho_thread.close(client)


def _epmd_names() -> set[str]:
    epmd = binary("epmd")
    if epmd is None:
        return set()
    done = subprocess.run([epmd, "-names"], capture_output=True, text=True, timeout=10)
    return {line.split()[1] for line in done.stdout.splitlines() if line.startswith("name ")}


def _version(nats: str) -> str:
    """What `nats-server --version` says: "v2.9.10" (Debian 12), another first on PATH."""
    try:
        done = subprocess.run([nats, "--version"], capture_output=True, text=True, timeout=10)
    except OSError:
        return "?"
    words = done.stdout.split()
    return words[-1] if words else "?"


class NatsCluster(Engine):
    """`size` nats-server nodes in one cluster with JetStream (which holds the MQTT state) and an
    MQTT listener each (MQTT 3.1.1 only: a v5 CONNECT is refused). Ready when every node's
    /healthz says JetStream is."""

    def __init__(self, folder: Path, size: int = 3, mqtt: str = "") -> None:
        """`mqtt`: more settings of the nodes' `mqtt {}` block (`ack_wait: "5s"`, ...)."""
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.size = size
        self.nodes = [Node(f"n{i}", free_port()) for i in range(size)]
        self._monitor = [free_port() for _ in range(size)]
        routes = [free_port() for _ in range(size)]
        every = ", ".join(f"nats-route://{LOOPBACK}:{port}" for port in routes)
        nats = binary("nats-server") or "nats-server"
        self.version = _version(nats)
        self._processes = []
        for i, node in enumerate(self.nodes):
            config = folder / f"{node.name}.conf"
            config.write_text(
                f"server_name: {node.name}\n"
                f"listen: {LOOPBACK}:{free_port()}\n"
                f"http: {LOOPBACK}:{self._monitor[i]}\n"
                f'jetstream {{ store_dir: "{folder}/js{i}" }}\n'
                f"cluster {{ name: mcpd, listen: {LOOPBACK}:{routes[i]}, routes: [{every}] }}\n"
                f"mqtt {{\n  listen: {LOOPBACK}:{node.port}\n  {mqtt}\n}}\n"
            )
            self._processes.append(
                Process(node.name, [nats, "-c", str(config)], folder / f"{node.name}.log")
            )

    def start(self) -> None:
        for process in self._processes:
            process.start()
        for i, process in enumerate(self._processes):
            health = f"http://{LOOPBACK}:{self._monitor[i]}/healthz?js-enabled-only=true"
            process.wait_until(lambda health=health: answers(health))
            process.wait_until(lambda i=i: listening(self.nodes[i].port))
        # The first MQTT client makes JetStream create the MQTT streams, replicated on three
        # nodes: 5-10 s here, in which it gets no SUBACK. Done once, so that no test waits on it.
        for node in self.nodes:
            _subscribed(node, "mcpd-engines/ready", START_S + 10)

    def start_node(self, i: int) -> None:
        self._processes[i].start()
        self._processes[i].wait_until(lambda: listening(self.nodes[i].port))

    def streams(self, i: int) -> list[dict[str, Any]]:
        """The JetStream streams node `i` holds a replica of, each with its state and its
        consumers (/jsz): the MQTT messages' stream, and each MQTT session's subscription as a
        consumer of it, with its delivered and acknowledged sequences."""
        url = f"http://{LOOPBACK}:{self._monitor[i]}/jsz?consumers=true&config=true"
        with urllib.request.urlopen(url, timeout=10) as answer:
            found = json.load(answer)
        return [
            stream
            for account in found.get("account_details", [])
            for stream in account.get("stream_detail", [])
        ]

    def kill(self, i: int) -> None:
        self._processes[i].stop(signal.SIGKILL)

    def alive(self, i: int) -> bool:
        return self._processes[i].alive

    def log_text(self) -> str:
        return "\n".join(p.tail() for p in self._processes)

    def stop(self) -> None:
        for process in self._processes:
            process.stop(signal.SIGKILL)
