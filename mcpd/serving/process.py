"""The serving process: the inference service on the socket the governor holds.

Started by mcpd.governor.supervisor with the listening socket, its end of the socket pair and the
shared block on descriptors given on the command line (the protocol is mcpd.ipc), then the log
level and ROLE=FD for each TCP listener the governor holds too: `http=FD` where `[serving] http` is
set, `metrics=FD` where `[metrics] listen` is. It first puts itself below the governor
(lower_own_priority), waits for the configuration, serves, forwards events and
sends its model statistics once a second, applies the configurations the governor sends on reload,
acknowledging each (a first one it refuses ends it: it has nothing to serve with), and stops on
SIGTERM (finishing what it has taken) or as soon as the governor's end of the socket pair closes
(the governor is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping

from mcpd import config as config_module
from mcpd import logs, status
from mcpd.channel import Channel
from mcpd.events import Event, EventBus
from mcpd.ipc import EventFields, IpcError, Message, SharedBlock, stats_message
from mcpd.listen import Listener
from mcpd.placement import affinity
from mcpd.placement.plan import ModelPlacement
from mcpd.serving.service import InferenceService
from mcpd.status import PlacementDoc, StatusDocument
from sensors import cpulist
from sensors.episodes import Repeats

log = logging.getLogger("mcpd.serving")

NICE = 5
"""How much nicer than the governor the serving process runs when the governor could not get
real-time scheduling; its inference threads go further still (mcpd.serving.worker)."""
STATS_S = 1.0
CONFIG_TIMEOUT_S = 30.0
UNSENT_LOG_S = 60.0
"""A message that cannot be sent (no descriptor left for its memfd) is said at most this often."""


def lower_own_priority() -> None:
    """Normal scheduling (posix_spawn already asked for it; a process started by hand from a
    real-time shell has not), and below the governor. A real-time governor is above every normal
    task already, so serving keeps the normal priority, as the board's other programs have (a
    nicer one would hand them most of the CPU: half the throughput beside a busy simulator, in
    bench/governor.py); a governor that runs at normal priority gets serving NICE levels below it."""
    with contextlib.suppress(OSError):
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    try:
        governor_realtime = os.sched_getscheduler(os.getppid()) in (os.SCHED_FIFO, os.SCHED_RR)
    except OSError:
        governor_realtime = False
    if not governor_realtime:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), NICE))


class Serving:
    def __init__(
        self,
        channel: Channel,
        block: SharedBlock,
        listener: socket.socket,
        tcp: Mapping[str, socket.socket] | None = None,
    ) -> None:
        self.channel = channel
        self.block = block
        self.listener = listener
        self.tcp = dict(tcp or {})
        self.slots: dict[str, int] = {}
        self.service: InferenceService | None = None
        self.stop = asyncio.Event()
        self._configs: asyncio.Queue[tuple[config_module.Config, PlacementDoc]] = asyncio.Queue()
        self._unsent: Repeats[str] = Repeats(UNSENT_LOG_S)

    def batch_size(self, model: str) -> int:
        slot = self.slots.get(model)
        size = 0 if slot is None else self.block.batch(slot)
        return size if size > 0 else 1 << 30  # unset: the model's own max_batch bounds it

    def status(self) -> StatusDocument | None:
        """The governor's document with this process's own live model statistics (and the
        governor's energy per inference, which only it can reckon); None until the governor has
        published its first."""
        document = self.block.status()
        if document is not None and self.service is not None:
            joules = {
                name: entry.get("joules_per_inference")
                for name, entry in document["inference"].items()
            }
            document["inference"] = status.inference(self.service.stats(), joules)
        return document

    def _send(self, message: Message) -> None:
        try:
            self.channel.send(message)
        except IpcError as exc:
            unsaid = self._unsent.say(message["kind"], time.monotonic())
            if unsaid is not None:
                log.error("%s%s", exc, f" ({unsaid} more since)" if unsaid else "")

    def _on_event(self, event: Event) -> None:
        fields: EventFields = {
            "kind": event.kind,
            "message": event.message,
            "data": dict(event.data),
            "ts": event.ts,
        }
        self._send({"kind": "event", "event": fields})

    def _on_readable(self) -> None:
        messages = self.channel.receive()
        if messages is None:
            log.warning("the governor's end of the channel closed; stopping")
            self.stop.set()
            return
        for message in messages:
            if message["kind"] != "config":
                continue
            generation = message["generation"]
            try:
                config = config_module.parse(message["config"], "<from the governor>")
            except config_module.ConfigError as exc:
                log.error("configuration from the governor refused: %s", exc)
                self._send({"kind": "configured", "generation": generation, "error": str(exc)})
                if self.service is None:  # nothing to serve with
                    self.stop.set()
                continue
            self.slots = dict(message["slots"])
            self._send({"kind": "configured", "generation": generation, "error": None})
            self._configs.put_nowait((config, message["placement"]))

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        loop.add_signal_handler(signal.SIGINT, self.stop.set)
        loop.add_reader(self.channel.fileno(), self._on_readable)
        first = await self._first_config()
        if first is None:
            return 1
        config, placement = first
        events = EventBus()
        events.subscribe(self._on_event)
        self.service = InferenceService(
            config,
            self.status,
            self.batch_size,
            events,
            listener=Listener(self.listener, None),
            tcp=self.tcp,
            placements=place(placement),
        )
        await self.service.start()
        self._send({"kind": "ready"})
        stats = asyncio.create_task(self._send_stats())
        reloads = asyncio.create_task(self._apply_reloads())
        await self.stop.wait()
        stats.cancel()
        reloads.cancel()
        await self.service.stop()
        return 0

    async def _first_config(self) -> tuple[config_module.Config, PlacementDoc] | None:
        """The governor's configuration; None when it refused the first, it is told to stop, or
        none came in CONFIG_TIMEOUT_S."""
        taken = asyncio.ensure_future(self._configs.get())
        stopped = asyncio.ensure_future(self.stop.wait())
        done, _ = await asyncio.wait(
            (taken, stopped), timeout=CONFIG_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
        stopped.cancel()
        if taken in done:
            return taken.result()
        taken.cancel()
        if not done:
            log.error("no configuration from the governor in %g s", CONFIG_TIMEOUT_S)
        return None

    async def _send_stats(self) -> None:
        while True:
            assert self.service is not None
            self._send(stats_message(self.service.stats()))
            await asyncio.sleep(STATS_S)

    async def _apply_reloads(self) -> None:
        while True:
            config, placement = await self._configs.get()
            assert self.service is not None
            try:
                await self.service.reload(config, place(placement))
            except Exception:
                log.exception("reload of the serving process failed; it keeps its models")


def place(plan: PlacementDoc) -> dict[str, ModelPlacement]:
    """The event loop's thread (this one) where the plan puts it, else on every CPU mcpd may use:
    the process began on the governor's CPUs, which its threads would inherit. Returns where
    each model's threads go."""
    usable = tuple(sorted(cpulist.parse(plan["usable"]) or ()))
    loop = plan["serving_loop"]
    placed = cpulist.parse(loop["cpus"]) if loop["skipped"] is None else None
    affinity.pin(placed or usable, "serving's event loop")
    return {name: ModelPlacement.of(doc, usable) for name, doc in plan["models"].items()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    extra = dict(arg.split("=", 1) for arg in args[4:] if "=" in arg)
    if len(args) < 4 or len(extra) != len(args) - 4 or set(extra) - {"http", "metrics"}:
        print(__doc__, file=sys.stderr)
        return 2
    listen_fd, channel_fd, block_fd = (int(arg) for arg in args[:3])
    logs.setup(args[3], os.environ, sys.stderr)  # the same stream as the governor's: journald's
    lower_own_priority()
    listener = socket.socket(fileno=listen_fd)
    listener.setblocking(False)
    tcp = {role: socket.socket(fileno=int(fd)) for role, fd in extra.items()}
    for sock in tcp.values():
        sock.setblocking(False)
    serving = Serving(
        Channel(socket.socket(fileno=channel_fd)),
        SharedBlock(block_fd, create=False),
        listener,
        tcp,
    )
    return asyncio.run(serving.run())
