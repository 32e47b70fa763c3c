"""The serving process: started, watched and restarted by the governor.

mcpd's first duty is governing, so everything that runs models or parses clients' requests (the HTTP
front, the batcher, onnxruntime, RKNN, OpenVINO) runs in a child process: a model that segfaults, a
client's shared memory that raises SIGBUS, an out-of-memory kill each end that process, never the
governor. The governor:

- holds the listening sockets (the Unix socket and the optional TCP listeners, `[serving] http`
  and `[metrics] listen`) and starts each child with them (mcpd.governor.serving_child), so no
  client is ever refused;
- restarts it whenever it exits, for any reason (serving_child.restart_policy, on mcpd.backoff):
  at once after a stable run and after the first quick exit, then after a delay that doubles
  with each further quick exit. Each exit is logged and published as an event; while a crash
  loop waits, the stand-in (mcpd.governor.standin) answers status and tells everyone else when
  to retry;
- talks to it through mcpd.ipc: batch sizes and its status document in shared memory, the
  configuration, events and model statistics over a socket pair. A configuration is sent until
  the serving process acknowledges it (mcpd.governor.config_delivery); a serving process left
  without any (one that could not be sent, or that it refused) is stopped at once, so that the
  crash-loop delay and the stand-in follow rather than a silent socket.

A request in flight when the child dies has its connection closed by the kernel at once (no hang);
mcpd.client repeats it once on a fresh connection, which the next child answers.

Everything here runs on one thread of the governor, which never waits on the child: every socket
is non-blocking and the child is reaped with waitpid(WNOHANG) on a short tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping

from mcpd.channel import Channel
from mcpd.config import Config, tcp_listeners
from mcpd.events import Event, EventBus
from mcpd.governor.config_delivery import ConfigDelivery
from mcpd.governor.serving_block import ServingBlock
from mcpd.governor.serving_child import ServingChild, ServingSockets, restart_policy
from mcpd.governor.serving_reports import ServingReports
from mcpd.governor.standin import StandIn
from mcpd.snapshot import ModelStats
from mcpd.status import ExitDoc, PlacementDoc, ServingDoc, ServingState, StatusDocument

log = logging.getLogger("mcpd.governor.supervisor")

TICK_S = 0.05
"""How often a child that is going away (or being stopped) is looked for."""
STOP_S = 15.0
"""How long a stopping child may finish the requests it has taken before it is killed."""


class ServingSupervisor:
    name = "serving"

    def __init__(
        self,
        config: Config,
        status: Callable[[], StatusDocument],
        batch_sizes: Callable[[], Mapping[str, int]],
        events: EventBus,
        *,
        placement: Callable[[Config], PlacementDoc],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`placement`: the placement plan for a configuration, sent with it."""
        self.config = config
        self._placement = placement
        self._status = status
        self.events = events
        self.clock = clock
        self.restarts = 0
        self.last_exit: ExitDoc | None = None
        self.state: ServingState = "stopped"
        self._block = ServingBlock(status, batch_sizes)
        self._delivery = ConfigDelivery(self._config_settled)
        self._reports = ServingReports(events, self._delivery)
        self._sockets: ServingSockets | None = None
        self._child: ServingChild | None = None
        self._standin: StandIn | None = None
        self._restarts = restart_policy()
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
        self._sockets = ServingSockets.bind(self.config)
        self._block.open(self.config)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        where = self._sockets.where(self.config)
        log.info("serving the Open Inference Protocol on %s (serving process supervised)", where)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, STOP_S + 5)
        if self._sockets is not None:
            self._sockets.close()
            self._sockets = None
        self._block.close()
        for end in (self._wake_r, self._wake_w):
            if end is not None:
                end.close()

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

    @property
    def pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    @property
    def _channel(self) -> Channel | None:
        return None if self._child is None else self._child.channel

    def stats(self) -> dict[str, ModelStats]:
        return dict(self._reports.stats)

    @property
    def config_error(self) -> str | None:
        return self._delivery.error

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
        if self._child is None and now >= self._restarts.backoff.next_at:
            self._spawn()
        with self._lock:
            config, self._reload = self._reload, None
        if config is not None:
            self.config = config
            self._block.assign_slots(config)
            self._send_config()
        self._delivery.deliver(self._channel, now)
        if self._block.publish(now, self._changed):
            self._changed = False
        self._wait(self._timeout(now))
        self._reap()

    def _timeout(self, now: float) -> float:
        """Until the next thing due: a status refresh, a start, a stand-in deadline. A child's exit
        wakes the select (its end of the socket pair closes); it is then reaped on the short tick,
        since the close comes while the process is still going away."""
        due = [self._block.status_due]
        if self._child is None:
            due.append(self._restarts.backoff.next_at)
        elif self._channel is None:
            due.append(now + TICK_S)
        if self._standin is not None:
            due.append(now + StandIn.TICK_S)
        if self._delivery.resend_at is not None:
            due.append(self._delivery.resend_at)
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
        assert self._sockets is not None and self._block.block is not None
        if self._standin is not None:
            self._standin.close()
            self._standin = None
        try:
            self._child = ServingChild.start(self._sockets, self._block.block.fd, self.clock)
        except OSError as exc:
            self._exited(f"could not start: {exc.strerror}", 0.0)
            return
        self.state = "starting"
        self._changed = True
        self._send_config()
        log.info("serving process %d started", self._child.pid)

    def _send_config(self) -> None:
        placement = self._placement(self.config)
        self._delivery.send(self.config, self._block.slots, placement, self._channel, self.clock())

    def _config_settled(self, error: str | None) -> None:
        self._changed = True
        if error is not None and not self._delivery.configured and self._child is not None:
            # It has nothing to serve with: stopped now, not after its wait for a configuration.
            self._child.terminate()

    def _take_messages(self) -> None:
        assert self._child is not None and self._child.channel is not None
        messages = self._child.channel.receive()
        if messages is None:  # the child closed its end: it is exiting; _reap sees it
            self._child.close_channel()
            return
        if self._reports.take(messages):
            self.state = "ready"

    def _reap(self) -> None:
        if self._child is None:
            return
        reason = self._child.exit_reason()
        if reason is not None:
            self._exited(reason, self.clock() - self._child.started_at)

    def _exited(self, reason: str, lived_s: float) -> None:
        child, self._child = self._child, None
        pid = None if child is None else child.pid
        if child is not None:
            child.close()
        self._delivery.lost()
        self._reports.lost()
        self.last_exit = {"pid": pid, "reason": reason, "ts": round(time.time(), 3)}
        self._changed = True
        if self._stop.is_set():
            return
        self.restarts += 1
        delay = self._restarts.exited(lived_s, self.clock())
        if delay:
            self.state = "restarting"
            assert self._sockets is not None
            self._standin = StandIn(
                self._sockets.answering,
                self._status,
                self._why,
                self.clock,
                metrics=self._sockets.tcp.get("metrics"),
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
        if self._child is None:
            return
        self._child.terminate()
        deadline = self.clock() + STOP_S
        while self._child is not None and self.clock() < deadline:
            if self._channel is not None:
                self._wait(TICK_S)
            else:
                time.sleep(TICK_S)
            self._reap()
        if self._child is not None:
            log.error(
                "serving process %d did not stop in %g s; killing it", self._child.pid, STOP_S
            )
            self._child.kill()
            self._child = None
        self.state = "stopped"
