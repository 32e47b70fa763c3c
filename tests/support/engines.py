"""Real engines for the tests and the benchmarks, from their Debian packages (tests/run installs
them), each on free loopback ports: the process machinery and a TCP balancer (haproxy). The MQTT
broker clusters are in tests/support/mqtt_clusters.py, the time-series stores (VictoriaMetrics,
Prometheus, vmagent) in tests/support/stores.py.

    with Haproxy(tmp_path, [n.port for n in cluster.nodes]) as lb:  # lb.port, lb.address

Every engine starts its processes in `start()` (or `with`), waits until they answer, and ends them
in `stop()`; a process that exits early, or does not answer within START_S, is an EngineError with
the end of its log. `missing(*names)` says why a test cannot run here (an engine not installed),
or None: tests skip with that reason, and only then.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.mqtt_broker import TlsFiles, free_port

START_S = 20.0
"""How long an engine may take to answer (ejabberd and NATS take 1-5 s on two busy cores)."""
LOOPBACK = "127.0.0.1"


class EngineError(RuntimeError):
    pass


def binary(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def missing(*names: str) -> str | None:
    """Why a test of these engines cannot run here, or None: the reason its skip gives."""
    absent = [name for name in names if binary(name) is None]
    if absent:
        return f"{', '.join(absent)} not installed (tests/run installs it)"
    return None


def listening(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@dataclass(frozen=True)
class Node:
    """One MQTT endpoint (a cluster node, or the balancer): tests.support.mqtt_broker.Endpoint."""

    name: str
    port: int
    tls: TlsFiles | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"


class Process:
    """One engine process, its output in a log file."""

    def __init__(self, name: str, command: list[str], log: Path, **popen: Any) -> None:
        self.name = name
        self.command = command
        self.log = log
        self.popen = popen
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, **self.popen
            )

    def wait_until(self, ready: Any, timeout: float = START_S) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.process is not None and self.process.poll() is not None:
                raise EngineError(f"{self.name} exited ({self.process.returncode}): {self.tail()}")
            if time.monotonic() > deadline:
                raise EngineError(f"{self.name} not ready within {timeout:g} s: {self.tail()}")
            time.sleep(0.05)

    def send(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None:
            return
        self.send(sig)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, size: int = 2000) -> str:
        try:
            return self.log.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return "(no log)"


class Engine:
    def __enter__(self) -> Any:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class Haproxy(Engine):
    """haproxy in TCP mode on one port in front of `ports`: least connections first, and a
    server that fails two checks 0.5 s apart is left out until it passes two again."""

    def __init__(self, folder: Path, ports: list[int]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls: TlsFiles | None = None
        servers = "".join(
            f"  server s{i} {LOOPBACK}:{port} check inter 500ms fall 2 rise 2\n"
            for i, port in enumerate(ports)
        )
        config = folder / "haproxy.cfg"
        config.write_text(
            "defaults\n  mode tcp\n  timeout connect 1s\n"
            # Longer than 1.5 x a board's keepalive_s (30 s): an idle board is not cut.
            "  timeout client 120s\n  timeout server 120s\n"
            f"frontend mqtt\n  bind {LOOPBACK}:{self.port}\n  default_backend nodes\n"
            f"backend nodes\n  balance leastconn\n{servers}"
        )
        haproxy = binary("haproxy") or "haproxy"
        self._process = Process("haproxy", [haproxy, "-f", str(config), "-db"], folder / "log")

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self._process.start()
        self._process.wait_until(lambda: listening(self.port))

    def stop(self) -> None:
        self._process.stop()
