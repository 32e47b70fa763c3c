"""The serving process: started, watched and restarted by the governor.

mcpd's first duty is governing, so everything that runs models or parses clients' requests (the HTTP
front, the batcher, onnxruntime, RKNN) runs in a child process: a model that segfaults, a client's
shared memory that raises SIGBUS, an out-of-memory kill each end that process, never the governor.
The governor:

- holds the listening sockets (the Unix socket and the optional TCP listeners, `[serving] http`
  and `[metrics] listen`) and hands them to each child, so no client is ever refused: while
  serving restarts, connections (and Prometheus' scrapes) wait in the backlog;
- starts the child with normal scheduling (the governor itself may run real-time, mcpd.governor.realtime),
  which then lowers its own priority further, in a session and process group of its own: what it
  starts (the background optimizer, `mcpd optimize`) is killed with it when it exits, so a build
  never outlives the serving process that wanted it;
- restarts it whenever it exits, for any reason (restart_policy): at once if it had served
  STABLE_S, else after a delay that doubles with each quick exit (BACKOFF_FIRST_S ..
  BACKOFF_MAX_S). Each exit is logged and published as an event; while a crash loop waits, the stand-in (mcpd.governor.standin) answers status
  and tells everyone else when to retry;
- talks to it through mcpd.ipc: batch sizes and its status document in shared memory, the
  configuration, events and model statistics over a socket pair. A configuration is never
  dropped: it is sent again until the serving process acknowledges it (a full channel, a memfd
  it had no descriptor for); one that cannot be sent at all, or that serving refuses, is logged
  and shown in the status (`serving.config_error`), and a serving process left without any is
  stopped at once, so that the crash-loop delay and the stand-in follow rather than a silent
  socket.

A request in flight when the child dies has its connection closed by the kernel at once (no hang);
mcpd.client repeats it once on a fresh connection, which the next child answers.

Everything here runs on one thread of the governor, which never waits on the child: every socket
is non-blocking and the child is reaped with waitpid(WNOHANG) on a short tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping

from mcpd.backoff import Backoff, Restarts
from mcpd.config import Config, tcp_listeners
from mcpd.events import Event, EventBus
from mcpd.governor.standin import StandIn
from mcpd.ipc import SLOTS, Channel, IpcError, SharedBlock
from mcpd.listen import Listener, bind_tcp_listeners, listen
from mcpd.snapshot import ModelStats
from mcpd.status import ExitDoc, ServingDoc, StatusDocument

log = logging.getLogger("mcpd.governor.supervisor")

TICK_S = 0.05
"""How often a child that is going away (or being stopped) is looked for."""
STATUS_S = 1.0
"""How often the status document in shared memory is refreshed, besides after every governor
action (an event wakes the supervisor): the serving process answers status from it."""
STABLE_S = 10.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
RESEND_S = 5.0
"""How long a configuration the channel took waits for its acknowledgement before it is sent
again (serving answers at once: its event loop parses it on arrival)."""
STOP_S = 15.0
"""How long a stopping child may finish the requests it has taken before it is killed."""
ERROR_CHARS = 2000
"""Of a refusal the serving process sends, kept for the log and the status."""
CHILD_FDS = (3, 4, 5)
"""Where the child finds the listening socket, its end of the socket pair and the shared block."""
TCP_FDS = {"http": 6, "metrics": 7}
"""Where the child finds the TCP listeners there are (`[serving] http`, `[metrics] listen`), each
named on its command line as ROLE=FD."""
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


def describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"signal {signal.Signals(number).name}"
        except ValueError:
            return f"signal {number}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


class ServingSupervisor:
    name = "serving"

    def __init__(
        self,
        config: Config,
        status: Callable[[], StatusDocument],
        batch_sizes: Callable[[], Mapping[str, int]],
        events: EventBus,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._status = status
        self._batch_sizes = batch_sizes
        self.events = events
        self.clock = clock
        self.pid: int | None = None
        self.restarts = 0
        self.last_exit: ExitDoc | None = None
        self.config_error: str | None = None
        """Why the serving process does not have the newest configuration, when it does not."""
        self.state = "stopped"
        """starting, ready, restarting (waiting out a crash-loop delay) or stopped."""
        self._stats: dict[str, ModelStats] = {}
        self._slots: dict[str, int] = {}
        self._generation = 0
        """Configurations sent so far: each carries its number, and the acknowledgement names it."""
        self._unacknowledged: dict[str, object] | None = None
        """The newest configuration, until the serving process acknowledges it."""
        self._sent_at: float | None = None
        """When the channel took it; None while it has not."""
        self._configured = False
        """The serving process has taken a configuration (it has none until then)."""
        self._listener: Listener | None = None
        self._tcp: dict[str, socket.socket] = {}
        """The TCP listeners by role (mcpd.config.tcp_listeners)."""
        self._block: SharedBlock | None = None
        self._channel: Channel | None = None
        self._standin: StandIn | None = None
        self._started_at = 0.0
        self._restarts = restart_policy()
        self._published_batch: Mapping[str, int] | None = None
        self._status_at = -1e9
        self._lock = threading.Lock()
        self._reload: Config | None = None
        self._changed = False
        """A governor action happened, or a serving process started or exited: publish the batch
        sizes and the status now (so status never names a serving process that is gone)."""
        events.subscribe(self._on_event)
        self._stop = threading.Event()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="serving-supervisor", daemon=True)

    # -- the daemon's side (event loop thread) ---------------------------------------------------

    async def start(self) -> None:
        """Bind (or take systemd's socket) and start the first serving process."""
        self._listener = listen(self.config.daemon.socket, self.config.daemon.socket_group)
        try:
            self._tcp = bind_tcp_listeners(tcp_listeners(self.config))
        except Exception:
            self._close_listeners()
            raise
        self._block = SharedBlock.create()
        self._assign_slots(self.config)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        where = self._listener.path or "the socket passed by systemd"
        where += "".join(f" and {text}" for text, _ in tcp_listeners(self.config).values())
        log.info("serving the Open Inference Protocol on %s (serving process supervised)", where)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, STOP_S + 5)
        self._close_listeners()
        if self._block is not None:
            self._block.close()
            self._block = None
        for end in (self._wake_r, self._wake_w):
            if end is not None:
                end.close()

    def _close_listeners(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.sock.close()
            if listener.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(listener.path)
        for sock in self._tcp.values():
            sock.close()
        self._tcp = {}

    async def reload(self, config: Config) -> None:
        if config.daemon.max_request_bytes != self.config.daemon.max_request_bytes:
            log.warning("reload: [daemon] max_request_bytes changes only on restart")
        if tcp_listeners(config) != tcp_listeners(self.config):
            log.warning("reload: [serving] http and [metrics] listen change only on restart")
        with self._lock:
            self._reload = config
        self._wake()

    def _on_event(self, event: Event) -> None:
        if event.kind == "governor":
            self._changed = True
            self._wake()

    def stats(self) -> dict[str, ModelStats]:
        return dict(self._stats)

    def info(self) -> ServingDoc:
        return {
            "pid": self.pid,
            "state": self.state,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "config_error": self.config_error,
        }

    def _wake(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

    # -- the supervisor thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:  # a bug here must not end supervision; the tick retries
                log.exception("serving supervisor step failed")
                time.sleep(TICK_S)
        self._terminate()

    def _step(self) -> None:
        now = self.clock()
        if self.pid is None and now >= self._restarts.backoff.next_at:
            self._spawn()
        with self._lock:
            config, self._reload = self._reload, None
        if config is not None:
            self.config = config
            self._assign_slots(config)
            self._send_config()
        self._deliver_config(now)
        self._publish(now)
        self._wait(self._timeout(now))
        self._reap()

    def _timeout(self, now: float) -> float:
        """Until the next thing due: a status refresh, a start, a stand-in deadline. A child's exit
        wakes the select (its end of the socket pair closes); it is then reaped on the short tick,
        since the close comes while the process is still going away."""
        due = [self._status_at + STATUS_S]
        if self.pid is None:
            due.append(self._restarts.backoff.next_at)
        elif self._channel is None:
            due.append(now + TICK_S)
        if self._standin is not None:
            due.append(now + StandIn.TICK_S)
        if self._sent_at is not None:
            due.append(self._sent_at + RESEND_S)
        return max(0.0, min(due) - now)

    def _wait(self, timeout: float) -> None:
        assert self._wake_r is not None
        fds = [self._wake_r.fileno()]
        if self._channel is not None:
            fds.append(self._channel.fileno())
        if self._standin is not None:
            fds += self._standin.fds()
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except (OSError, ValueError):
            return
        for fd in readable:
            if fd == self._wake_r.fileno():
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            elif self._channel is not None and fd == self._channel.fileno():
                self._take_messages()
            elif self._standin is not None:
                self._standin.ready(fd)
        if self._standin is not None:
            self._standin.expire()

    def _spawn(self) -> None:
        assert self._listener is not None and self._block is not None
        if self._standin is not None:
            self._standin.close()
            self._standin = None
        channel, theirs = Channel.pair()
        sources = [self._listener.sock.fileno(), theirs.fileno(), self._block.fd]
        targets = list(CHILD_FDS)
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        argv = [sys.executable, *_interpreter_flags(), "-m", "mcpd.serving"]
        argv += [*map(str, CHILD_FDS), level]
        for role, sock in self._tcp.items():
            sources.append(sock.fileno())
            targets.append(TCP_FDS[role])
            argv.append(f"{role}={TCP_FDS[role]}")
        # Above the targets, so that no dup2 onto 3..7 overwrites a source still to be placed.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in sources]
        env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
        try:
            self.pid = os.posix_spawn(
                sys.executable,
                argv,
                env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, fd, target)
                    for fd, target in zip(high, targets, strict=True)
                ],
                setsigmask=(),
                setsid=True,
                scheduler=(os.SCHED_OTHER, os.sched_param(0)),
            )
        except OSError as exc:
            channel.close()
            self._exited(f"could not start: {exc.strerror}", 0.0)
            return
        finally:
            for fd in high:
                os.close(fd)
            theirs.close()
        self._channel = channel
        self._started_at = self.clock()
        self.state = "starting"
        self._changed = True
        self._send_config()
        log.info("serving process %d started", self.pid)

    def _send_config(self) -> None:
        self._generation += 1
        self._unacknowledged = {
            "kind": "config",
            "generation": self._generation,
            "config": dataclasses.asdict(self.config),
            "slots": dict(self._slots),
        }
        self._sent_at = None
        self._deliver_config(self.clock())

    def _deliver_config(self, now: float) -> None:
        """Send the configuration not acknowledged yet: now if the channel has not taken it (it
        was full), again once RESEND_S has passed since it did."""
        if self._unacknowledged is None or self._channel is None:
            return
        if self._sent_at is not None and now - self._sent_at < RESEND_S:
            return
        try:
            if self._channel.send(self._unacknowledged):
                self._sent_at = now
        except IpcError as exc:
            self._unacknowledged, self._sent_at = None, None
            self._config_failed(f"configuration {self._generation} not sent: {exc}")

    def _config_failed(self, why: str) -> None:
        self.config_error = why
        self._changed = True
        log.error("%s", why)
        if not self._configured and self.pid is not None:
            # It has nothing to serve with: stopped now, not after its wait for a configuration.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def _acknowledged(self, generation: object, error: object) -> None:
        if generation != self._generation:
            return  # an earlier configuration's; the newest one's is on its way
        self._unacknowledged, self._sent_at = None, None
        if error is None:
            self._configured = True
            self.config_error = None
            self._changed = True
        else:
            refusal = str(error)[:ERROR_CHARS]
            self._config_failed(
                f"the serving process refused configuration {generation}: {refusal}"
            )

    def _assign_slots(self, config: Config) -> None:
        """Keep each configured model's slot; a new model takes the lowest one no configured model
        holds (a removed model's slot is free again)."""
        names = [model.name for model in config.models]
        self._slots = {name: slot for name, slot in self._slots.items() if name in names}
        free = iter(sorted(set(range(SLOTS)) - set(self._slots.values())))
        for name in names:
            if name not in self._slots:
                self._slots[name] = next(free)

    def _take_messages(self) -> None:
        assert self._channel is not None
        messages = self._channel.receive()
        if messages is None:  # the child closed its end: it is exiting; _reap sees it
            self._channel.close()
            self._channel = None
            return
        for message in messages:
            kind = message.get("kind")
            if kind == "ready":
                self.state = "ready"
            elif kind == "configured":
                self._acknowledged(message.get("generation"), message.get("error"))
            elif kind == "event":
                self._forward(message.get("event"))
            elif kind == "stats":
                self._stats = _model_stats(message.get("models"))

    def _forward(self, event: object) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("message"), str):
            return
        data = event.get("data")
        self.events.publish(
            Event(
                str(event.get("kind", "model")),
                event["message"],
                data if isinstance(data, dict) else {},
            )
        )

    def _publish(self, now: float) -> None:
        """Batch sizes whenever the governor changes them; the status document after every
        governor action and once a second."""
        assert self._block is not None
        sizes = self._batch_sizes()
        if sizes is not self._published_batch:
            for name, size in sizes.items():
                slot = self._slots.get(name)
                if slot is not None:
                    self._block.set_batch(slot, size)
            self._published_batch = sizes
        if self._changed or now - self._status_at >= STATUS_S:
            self._block.set_status(self._status())
            self._status_at = now
            self._changed = False

    def _reap(self) -> None:
        if self.pid is None:
            return
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 0
        if pid == 0:
            return
        self._exited(describe_exit(status), self.clock() - self._started_at)

    def _exited(self, reason: str, lived_s: float) -> None:
        pid, self.pid = self.pid, None
        if pid is not None:
            _kill_group(pid)
        self._configured, self._unacknowledged, self._sent_at = False, None, None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._stats = {name: dataclasses.replace(s, ready=False) for name, s in self._stats.items()}
        self.last_exit = {"pid": pid, "reason": reason, "ts": round(time.time(), 3)}
        self._changed = True
        if self._stop.is_set():
            return
        self.restarts += 1
        delay = self._restarts.exited(lived_s, self.clock())
        if delay:
            self.state = "restarting"
            assert self._listener is not None
            listeners = [self._listener.sock] + [s for r, s in self._tcp.items() if r != "metrics"]
            self._standin = StandIn(
                listeners, self._status, self._why, self.clock, metrics=self._tcp.get("metrics")
            )
            message = (
                f"serving process {pid} exited ({reason}) after {lived_s:.1f} s, "
                f"{self._restarts.backoff.failures} quick exits in a row; next start in {delay:g} s"
            )
            log.error("%s", message)
        else:
            self.state = "starting"
            message = f"serving process {pid} exited ({reason}) after {lived_s:.1f} s; restarting"
            log.warning("%s", message)
        self.events.publish(
            Event(
                "daemon",
                message,
                {"serving": {"pid": pid, "reason": reason, "restarts": self.restarts}},
            )
        )

    def _why(self) -> tuple[str, float]:
        reason = "not started" if self.last_exit is None else self.last_exit["reason"]
        why = f"the serving process exited ({reason})"
        if self.config_error is not None:
            why += f"; {self.config_error}"
        return why, max(0.0, self._restarts.backoff.next_at - self.clock())

    def _terminate(self) -> None:
        """Stop the child: it stops accepting, finishes what it has taken, and exits."""
        if self._standin is not None:
            self._standin.close()
            self._standin = None
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = self.clock() + STOP_S
        while self.pid is not None and self.clock() < deadline:
            if self._channel is not None:
                self._wait(TICK_S)
            else:
                time.sleep(TICK_S)
            self._reap()
        if self.pid is not None:
            log.error("serving process %d did not stop in %g s; killing it", self.pid, STOP_S)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            _kill_group(self.pid)
            self.pid = None
        self.state = "stopped"


def _kill_group(pid: int) -> None:
    """Kill what an exited serving process left in its process group (a build it had started,
    which was reparented to init and ran on: three kills, three builds at once). Its pid stays
    the group's id, never reused, while any member lives."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _model_stats(models: object) -> dict[str, ModelStats]:
    """Statistics as the child sent them; anything malformed is left out."""
    stats: dict[str, ModelStats] = {}
    if not isinstance(models, dict):
        return stats
    for name, fields in models.items():
        if not isinstance(fields, dict):
            continue
        try:
            stats[str(name)] = ModelStats(**fields)
        except TypeError:
            continue
    return stats


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
