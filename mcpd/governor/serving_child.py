"""The serving process as the governor starts, reaps and ends it (mcpd.governor.supervisor says
when).

It is started with normal scheduling (the governor itself may run real-time,
mcpd.governor.realtime), which it then lowers further, in a session and process group of its own:
what it starts (the background optimizer, `mcpd optimize`) is killed with it when it exits, so a
build never outlives the serving process that wanted it. It finds the listening socket, its end of
the socket pair and the shared block on CHILD_FDS, and the TCP listeners on TCP_FDS, each named on
its command line (mcpd.serving.process). The governor holds the listening sockets
(ServingSockets) and hands them to each serving process, so no client is ever refused: while
serving restarts, connections (and Prometheus' scrapes) wait in the backlog.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass

from mcpd.backoff import Backoff, Restarts
from mcpd.channel import Channel
from mcpd.config import Config, tcp_listeners
from mcpd.listen import Listener, bind_tcp_listeners, listen

CHILD_FDS = (3, 4, 5)
"""Where the child finds the listening socket, its end of the socket pair and the shared block."""
TCP_FDS = {"http": 6, "metrics": 7}
"""Where the child finds the TCP listeners there are (`[serving] http`, `[metrics] listen`), each
named on its command line as ROLE=FD."""
STABLE_S = 10.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
_PRIVATE_ENV = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
)


def restart_policy() -> Restarts:
    """At once after a stable run and after the first quick exit, then BACKOFF_FIRST_S doubling
    up to BACKOFF_MAX_S while serving keeps exiting quickly."""
    return Restarts(Backoff(BACKOFF_FIRST_S, BACKOFF_MAX_S, at_once=1), STABLE_S)


@dataclass(frozen=True)
class ServingSockets:
    unix: Listener
    """Bound at the configured path, or the socket systemd passed."""
    tcp: dict[str, socket.socket]
    """The TCP listeners by role (mcpd.config.tcp_listeners)."""

    @classmethod
    def bind(cls, config: Config) -> ServingSockets:
        unix = listen(config.daemon.socket, config.daemon.socket_group)
        try:
            return cls(unix, bind_tcp_listeners(tcp_listeners(config)))
        except Exception:
            cls(unix, {}).close()
            raise

    @property
    def answering(self) -> list[socket.socket]:
        """Those the stand-in answers as the serving process would: all but `[metrics] listen`."""
        return [self.unix.sock] + [sock for role, sock in self.tcp.items() if role != "metrics"]

    def where(self, config: Config) -> str:
        where = self.unix.path or "the socket passed by systemd"
        return where + "".join(f" and {text}" for text, _ in tcp_listeners(config).values())

    def close(self) -> None:
        self.unix.sock.close()
        if self.unix.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.unix.path)
        for sock in self.tcp.values():
            sock.close()


class ServingChild:
    """One serving process: its pid and the governor's end of its socket pair."""

    def __init__(self, pid: int, channel: Channel, started_at: float) -> None:
        self.pid = pid
        self.channel: Channel | None = channel
        """None once the serving process has closed its end: it is exiting."""
        self.started_at = started_at

    @classmethod
    def start(
        cls, sockets: ServingSockets, block_fd: int, clock: Callable[[], float]
    ) -> ServingChild:
        """Raises OSError when it cannot be started."""
        channel, theirs = Channel.pair()
        try:
            pid = _spawn(sockets, theirs, block_fd)
        except OSError:
            channel.close()
            raise
        finally:
            theirs.close()
        return cls(pid, channel, clock())

    def exit_reason(self) -> str | None:
        """How it ended, reaping it; None while it runs."""
        try:
            reaped, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            reaped, status = self.pid, 0
        return None if reaped == 0 else describe_exit(status)

    def terminate(self) -> None:
        """Ask it to stop: it stops accepting, finishes what it has taken, and exits."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """End it now, reaping it, and what it left in its process group."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.close()

    def close_channel(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def close(self) -> None:
        """After it exited: kill what it left in its process group (a build it had started, which
        was reparented to init and ran on: three kills, three builds at once; its pid stays the
        group's id, never reused, while any member lives), and let go of the channel."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.close_channel()


def describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"signal {signal.Signals(number).name}"
        except ValueError:
            return f"signal {number}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _spawn(sockets: ServingSockets, channel: socket.socket, block_fd: int) -> int:
    sources = [sockets.unix.sock.fileno(), channel.fileno(), block_fd]
    targets = list(CHILD_FDS)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    argv = [sys.executable, *_interpreter_flags(), "-m", "mcpd.serving"]
    argv += [*map(str, CHILD_FDS), level]
    for role, sock in sockets.tcp.items():
        sources.append(sock.fileno())
        targets.append(TCP_FDS[role])
        argv.append(f"{role}={TCP_FDS[role]}")
    # Above the targets, so that no dup2 onto 3..7 overwrites a source still to be placed.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in sources]
    env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
    try:
        return os.posix_spawn(
            sys.executable,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(high, targets, strict=True)
            ],
            setsigmask=(),
            setsid=True,
            scheduler=(os.SCHED_OTHER, os.sched_param(0)),
        )
    finally:
        for fd in high:
            os.close(fd)


def _interpreter_flags() -> list[str]:
    """The governor's own interpreter options (the package runs it isolated, without bytecode
    writes, with the fault handler on), for the serving process too."""
    flags = []
    if sys.flags.isolated:
        flags.append("-I")
    if sys.flags.dont_write_bytecode:
        flags.append("-B")
    if "faulthandler" in sys._xoptions:
        flags += ["-X", "faulthandler"]
    return flags
