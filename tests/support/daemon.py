"""A real `mcpd run`, usually on a simulated board: the one command line, the process with its
stderr in a log file (quoted in every failure), the serving socket it answers on, and its stop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from mcpd.client import Client
from tests.conftest import PROJECT
from tests.support.waiting import wait_until

T = TypeVar("T")


def mcpd_run(config: Path, *args: str, python: str = sys.executable) -> list[str]:
    """The command line of `mcpd run` with this config file and these further options."""
    return [python, "-m", "mcpd", "run", "--config", str(config), *args]


def simulated(profile: str, root: Path, *args: str) -> list[str]:
    """The options that run the daemon on a simulated `profile` board built under `root`."""
    return ["--simulate", profile, "--sim-root", str(root), *args]


class DaemonProcess:
    """`mcpd run` started with its stderr in `log`; as a context manager it is stopped on exit
    (SIGTERM, then SIGKILL if it has not ended in `stop_timeout` s)."""

    def __init__(
        self,
        config: Path,
        *args: str,
        log: Path,
        env: Mapping[str, str] | None = None,
        stop_timeout: float = 20.0,
        **popen: Any,
    ) -> None:
        self.config, self.log, self.stop_timeout = config, log, stop_timeout
        with open(log, "wb") as stderr:
            self.process: subprocess.Popen[bytes] = subprocess.Popen(
                mcpd_run(config, *args), cwd=PROJECT, env=env, stderr=stderr, **popen
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_until(
        self, predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1
    ) -> T:
        """`wait_until`, failing at once with the log if the daemon exits before `predicate`
        holds."""

        def unless_exited() -> T:
            value = predicate()
            if not value:
                assert self.process.poll() is None, f"the daemon exited:\n{self.log_text()}"
            return value

        return wait_until(unless_exited, timeout, what, interval=interval, detail=self.log_text)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def models_ready(sock: Path, *models: str) -> bool:
    """Whether the daemon on `sock` answers and has every one of `models` ready."""
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


class RunningDaemon:
    """The daemon as systemd runs it, on a simulated board at ten times real speed: its
    sd_notify messages arrive on a socket of the test's own (`receive`)."""

    def __init__(
        self,
        tmp_path: Path,
        config: str,
        *args: str,
        watchdog_usec: int = 0,
        profile: str = "rk3588",
    ) -> None:
        self.root = tmp_path / "board"
        self.config = tmp_path / "mcpd.toml"
        self.config.write_text(config)
        self.log = tmp_path / "daemon.log"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(tmp_path / "notify.sock"))
        self.messages: list[str] = []
        env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify.sock"))
        if watchdog_usec:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        self.daemon = DaemonProcess(
            self.config,
            *simulated(profile, self.root, "--sim-speed", "10", *args),
            log=self.log,
            env=env,
        )
        self.process = self.daemon.process

    def receive(self, until: Callable[[str], bool], timeout: float = 30.0) -> str:
        def matched() -> str | None:
            self.notify.settimeout(0.1)
            try:
                message = self.notify.recv(4096).decode()
            except TimeoutError:
                return None
            self.messages.append(message)
            return message if until(message) else None

        return wait_until(
            matched,
            timeout,
            "a matching notify message",
            interval=0,
            detail=lambda: f"got {self.messages[-5:]}\n{self.daemon.log_text()}",
        )

    def drain(self) -> None:
        self.notify.setblocking(False)
        try:
            while True:
                self.messages.append(self.notify.recv(4096).decode())
        except BlockingIOError:
            pass
        finally:
            self.notify.setblocking(True)

    def wait_for(self, condition: Callable[[], T], timeout: float = 30.0) -> T:
        def drained_unless() -> T:
            value = condition()
            if not value:
                self.drain()
            return value

        return self.daemon.wait_until(drained_unless, timeout, "the condition", interval=0.05)

    def cap(self, rel: str) -> int:
        # The daemon truncates, then writes: a read in between sees an empty file.
        text = wait_until(lambda: (self.root / rel).read_text(), 30, rel, interval=0.01)
        return int(text)

    def close(self) -> None:
        self.daemon.stop()
        self.notify.close()


def new_child(daemon: RunningDaemon, sock: Path, old: int, model: str = "demo") -> int:
    """Wait until a serving process other than `old` answers with `model` ready; its pid."""

    def answered() -> int | None:
        if not models_ready(sock, model):
            return None
        pid = status(sock)["serving"]["pid"]
        return None if pid in (None, old) else int(pid)

    return daemon.wait_for(answered, 60)
