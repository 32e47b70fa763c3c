"""A real mosquitto for the MQTT tests and the fleet benchmark, and a client that records.

Each broker runs with its own config on a free loopback port (never 1883, where a packaged
mosquitto may be listening), logs into its folder, and can be stopped, killed and started again
on the same port to play a broker outage.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mcpd.config import MqttSection
from mcpd.ctl import paho_thread
from mcpd.schema import build
from mcpd.telemetry.journal import Message
from mcpd.telemetry.publisher import Publisher
from mcpd.telemetry.spool import Spool
from tests.support.mqtt_status import FakeBoard


def mosquitto_binary() -> str | None:
    return shutil.which("mosquitto", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's range for outgoing connections
    (`net.ipv4.ip_local_port_range`), and never the same one twice in a process. An engine
    started again on its port (a cluster node killed and restarted) must find it free: a port
    from that range was taken meanwhile by one of 200 boards' connections in a bench run
    ("bind: address already in use")."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        outgoing = int(ports.read().split()[0])
    below = outgoing if outgoing > 11_000 else 65_536  # a range of nearly all: nowhere is safe
    while True:
        port = random.randrange(10_000, below)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


def _signed(folder: Path, name: str, extension: str) -> tuple[Path, Path]:
    """A certificate `name`.pem and its key, signed by the CA in `folder`."""
    subject = f"/CN=mcpd test {name}"
    _openssl(folder, "req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
    (folder / f"{name}.ext").write_text(extension + "\n")
    _openssl(
        folder,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
    )
    return folder / f"{name}.pem", folder / f"{name}.key"


def make_certificates(folder: Path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate (openssl)."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        folder,
        "req",
        "-x509",
        *_EC,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=mcpd test CA",
    )
    server = _signed(folder, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost")
    client = _signed(folder, "client", "extendedKeyUsage=clientAuth")
    return TlsFiles(folder / "ca.pem", *server, *client)


def server_certificate(tls: TlsFiles, name: str, names: str) -> TlsFiles:
    """`tls` with a server certificate of its own CA for other `names` (subjectAltName values)."""
    cert, key = _signed(tls.ca.parent, name, f"subjectAltName={names}")
    return dataclasses.replace(tls, server_cert=cert, server_key=key)


class Endpoint(Protocol):
    """Where a client connects: a Mosquitto, or a node of a cluster (tests/support/engines.py)."""

    @property
    def port(self) -> int: ...

    @property
    def tls(self) -> TlsFiles | None: ...


class Mosquitto:
    def __init__(
        self,
        folder: Path,
        *,
        tls: TlsFiles | None = None,
        users: dict[str, str] | None = None,
        persistent: bool = False,
        extra: str = "",
    ) -> None:
        binary = mosquitto_binary()
        if binary is None:
            raise RuntimeError("mosquitto is not installed (tests/run installs it)")
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        self.tls = tls
        self.log = folder / "mosquitto.log"
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        lines = [
            f"listener {self.port} 127.0.0.1",
            # Persistent: subscribers' sessions and their queued messages survive a restart.
            f"persistence {'true' if persistent else 'false'}",
            f"persistence_location {folder}/",
            f"log_dest file {self.log}",
            "log_type error\nlog_type warning\nlog_type notice\nlog_type information",
            "connection_messages true",
            "set_tcp_nodelay true",
            "max_queued_messages 0",
            f"user {getpass.getuser()}",  # as root mosquitto would switch to "mosquitto"
        ]
        if users:
            passwords = folder / "passwords"
            passwords.write_text("")
            passwords.chmod(0o600)
            for user, password in users.items():
                subprocess.run(
                    ["mosquitto_passwd", "-b", str(passwords), user, password],
                    check=True,
                    capture_output=True,
                )
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        else:
            lines.append("allow_anonymous true")
        if tls is not None:
            lines += [
                f"cafile {tls.ca}",
                f"certfile {tls.server_cert}",
                f"keyfile {tls.server_key}",
                "require_certificate true",
            ]
        self.config = folder / "mosquitto.conf"
        self.config.write_text("\n".join([*lines, extra]) + "\n")

    def __enter__(self) -> Mosquitto:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 10.0) -> None:
        with open(self.folder / "mosquitto.stderr", "ab") as stderr:
            self.process = subprocess.Popen(
                [self.binary, "-c", str(self.config)], stdout=subprocess.DEVNULL, stderr=stderr
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.log_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mosquitto not listening: {self.log_text()}") from None
                time.sleep(0.02)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)
        self.process = None

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else "(no log)"


def _length(n: int) -> bytes:
    """MQTT's variable byte integer."""
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (128 if n else 0))
        if not n:
            return bytes(out)


def _string(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


class Flood:
    """A client that publishes one message at QoS 0 as fast as a socket takes it: packets built
    once and written a thousand at a time (paho could not send fast enough to be a flood)."""

    def __init__(self, broker: Mosquitto, topic: str, payload: bytes) -> None:
        self.sent = 0
        self._stop = threading.Event()
        self._sock = socket.create_connection(("127.0.0.1", broker.port))
        connect = _string(b"MQTT") + bytes([4, 2]) + struct.pack(">H", 60) + _string(b"flood")
        self._sock.sendall(b"\x10" + _length(len(connect)) + connect)
        if self._sock.recv(4)[:1] != b"\x20":
            raise RuntimeError("no CONNACK for the flood client")
        body = _string(topic.encode()) + payload
        self._batch = (b"\x30" + _length(len(body)) + body) * 1000
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sock.sendall(self._batch)
            self.sent += 1000

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sock.close()


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    retain: bool
    at: float
    properties: Any

    def json(self) -> Any:
        return json.loads(self.payload)


class Recorder:
    """A subscriber that keeps every message it gets, and waits for the ones a test expects."""

    def __init__(
        self,
        broker: Endpoint,
        *topics: str,
        session: str = "",
        host: str = "127.0.0.1",
        protocol: str = "5",
        **auth: Any,
    ) -> None:
        """`session`: a client id whose session (and queued messages) outlive a disconnection."""
        self.messages: list[Received] = []
        self._cond = threading.Condition()
        v5 = protocol == "5"
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            session,
            protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
            clean_session=None if v5 else not session,
        )
        self.client.reconnect_delay_set(1, 1)
        if auth.get("username"):
            self.client.username_pw_set(auth["username"], auth.get("password"))
        if broker.tls is not None:
            self.client.tls_set(
                str(broker.tls.ca), str(broker.tls.client_cert), str(broker.tls.client_key)
            )
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: subscribed.set()
        if v5:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = 600 if session else 0
            self.client.connect(host, broker.port, clean_start=not session, properties=properties)
        else:
            self.client.connect(host, broker.port)
        self.client.loop_start()
        self.client.subscribe([(topic, 1) for topic in topics])
        if not subscribed.wait(10):
            raise RuntimeError("subscription not acknowledged")

    def _on_message(self, _c: Any, _u: Any, message: paho.MQTTMessage) -> None:
        received = Received(
            message.topic,
            bytes(message.payload),
            bool(message.retain),
            time.time(),
            message.properties,
        )
        with self._cond:
            self.messages.append(received)
            self._cond.notify_all()

    def on(self, topic: str) -> list[Received]:
        with self._cond:
            return [m for m in self.messages if m.topic == topic]

    def wait(
        self, condition: Callable[[list[Received]], bool], timeout: float = 10.0
    ) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not condition(self.messages):
                left = deadline - time.monotonic()
                if left <= 0:
                    topics = sorted({m.topic for m in self.messages})
                    raise AssertionError(f"timed out; {len(self.messages)} messages on {topics}")
                self._cond.wait(left)
            return list(self.messages)

    def wait_for(self, topic: str, count: int = 1, timeout: float = 10.0) -> list[Received]:
        self.wait(lambda ms: sum(m.topic == topic for m in ms) >= count, timeout)
        return self.on(topic)

    def close(self) -> None:
        paho_thread.close(self.client)


@contextmanager
def recording(broker: Endpoint, *topics: str, **options: Any) -> Iterator[Recorder]:
    recorder = Recorder(broker, *topics, **options)
    try:
        yield recorder
    finally:
        recorder.close()


def settings(broker: Endpoint, **overrides: Any) -> MqttSection:
    """[mqtt] for a test: this broker, 5 Hz telemetry, retries every second at most."""
    values: dict[str, Any] = {
        "enabled": True,
        "host": "127.0.0.1",
        "port": broker.port,
        "telemetry_ms": 200,
        "reconnect_max_s": 1,
    }
    if "brokers" in overrides:
        del values["host"], values["port"]
    return build(MqttSection, {**values, **overrides})


@contextmanager
def publishing(
    mqtt: MqttSection,
    folder: Path,
    device: str = "b1",
    status: Callable[[], Any] | None = None,
    run_command: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
    delivered: Callable[[Message], None] | None = None,
) -> Iterator[Publisher]:
    spool = folder / "telemetry.spool"
    if not spool.exists():
        # Count `seq` from 0, as on a board whose clock reads 1970 at its first start (else the
        # first number is ten per second of Unix time: see mcpd/telemetry/spool.py).
        Spool.open(spool, 10, time.monotonic, wall=lambda: 0.0).close()
    publisher = Publisher(
        mqtt, device, spool, status or FakeBoard(), run_command, delivered=delivered
    )
    publisher.start()
    try:
        yield publisher
    finally:
        publisher.stop()
