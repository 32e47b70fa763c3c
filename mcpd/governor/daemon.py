"""The daemon: a thin composition of the control loop and the services around it.

Lifecycle (as uvicorn's): startup (config, board, baseline, sensors, domains, services) -> main
(wait for signals; the control loop runs in its own thread so that neither the event loop nor
inference can delay a sample) -> shutdown (services, loop, restore the baseline caps). Signal
handlers only set events. SIGHUP reloads the config: an invalid file is rejected with a log line and
the running config stays in force; a valid one is applied whole (the loop swaps its settings at a
tick boundary).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from mcpd import config, status
from mcpd.events import Event, EventBus
from mcpd.governor import board, domains, reloading
from mcpd.governor.baseline import Baseline, baseline_folders
from mcpd.governor.cooling_store import CoolingStore
from mcpd.governor.energy import EnergyAccount, Served
from mcpd.governor.loop import GIL_SWITCH_INTERVAL_S, ControlLoop
from mcpd.governor.loop_settings import LoopSettings
from mcpd.governor.notify import Notifier
from mcpd.governor.power_map import PowerMapStore
from mcpd.governor.supervisor import ServingSupervisor
from mcpd.placement import affinity
from mcpd.placement.plan import ModelPlacement, Placement, Planner
from mcpd.snapshot import ModelStats, Snapshot
from mcpd.status import PlacementDoc
from mcpd.telemetry import TelemetryService
from mcpd.telemetry.commands import COMMANDS
from sensors.hotplug import HotplugMonitor
from sensors.topology import CpuTopology

log = logging.getLogger("mcpd")

READY_TIMEOUT_S = 30.0
RESTART_ONLY = (
    "placement",
    "sysfs_root",
    "state_dir",
    "runtime_dir",
    "socket",
    "socket_group",
    "max_request_bytes",
)
"""[daemon] keys that a reload cannot change (paths already open, sockets already bound)."""


class Service(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def reload(self, config: config.Config) -> None: ...


class Daemon:
    def __init__(
        self,
        load_config: Callable[[], config.Config],
        *,
        notifier: Notifier | None = None,
        live: Callable[[str], None] | None = None,
        scheduling: str = "normal",
        follow_log_level: bool = False,
    ) -> None:
        self.load_config = load_config
        self.config = load_config()
        self.follow_log_level = follow_log_level
        """Apply [daemon] log_level on reload (not when --log-level fixed it)."""
        self.profile = self.config.governor.profile
        # Reloads (main thread) and profile commands (telemetry thread) both set loop settings.
        self._settings_lock = threading.Lock()
        self.notifier = notifier or Notifier()
        self.live = live
        self.events = EventBus()
        self.root = Path(self.config.daemon.sysfs_root)
        self.board = board.detect(self.root)
        # Before the governor places itself: what it may use is where serving's unplaced work runs.
        self.planner = Planner(
            CpuTopology.from_sysfs(self.root), frozenset(os.sched_getaffinity(0))
        )
        self._placed: tuple[config.Config, PlacementDoc] = (
            self.config,
            self.planner(self.config).doc(),
        )
        self.baseline = Baseline.load(baseline_folders(self.config.daemon), self.root, self.board)
        hotplug = HotplugMonitor.start() if self.root == Path("/") else None
        self._started = time.monotonic()
        self.loop = ControlLoop(
            self.root,
            self.board,
            LoopSettings.from_config(self.config, self.profile),
            events=self.events,
            baseline=self.baseline,
            notifier=self.notifier,
            hotplug=hotplug,
            power_map=PowerMapStore(self.config.daemon.state_dir),
            cooling_store=CoolingStore(self.config.daemon.state_dir),
            on_status=self._on_status,
        )
        self.daemon_stats = status.DaemonStats(scheduling)
        self.energy = EnergyAccount()
        self._status_lock = threading.Lock()
        self.services: list[Service] = self._services()
        self._requests_seen: dict[str, int] = {}
        """Requests served per model at the previous live line (once a second)."""
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()
        self._loop_ended = asyncio.Event()

    def _services(self) -> list[Service]:
        services: list[Service] = []
        # Services plug in here. Each gets the config and whichever of status (the JSON status
        # document), batch sizes (self.loop.batch_size) and the event bus it needs.
        self.serving = ServingSupervisor(
            self.config,
            self.status,
            lambda: self.loop.batch_sizes,
            self.events,
            placement=lambda config: self.planner(config).doc(),
        )
        services.append(self.serving)
        self.telemetry = TelemetryService(self.config, self.status, self.events, self.command)
        services.append(self.telemetry)
        return services

    # -- what services see -----------------------------------------------------------------------

    def model_stats(self) -> dict[str, ModelStats]:
        stats: dict[str, ModelStats] = {}
        for service in self.services:
            provider = getattr(service, "stats", None)
            if provider is not None:
                stats.update(provider())
        return stats

    def status(self) -> status.StatusDocument:
        snapshot, stats = self.loop.snapshot, self.model_stats()
        served = {name: Served(s.requests, s.p50_ms) for name, s in stats.items()}
        threshold = self.loop.settings.params.temp_high_c
        with self._status_lock:  # status is asked for by the telemetry and serving threads
            self.energy.update(snapshot.energy_j, snapshot.ts, served)
            joules = self.energy.joules_per_inference()
            now = self.loop.clock()
            forecast = self.loop.forecast.seconds_to(threshold, now)
            self.loop.cooling.refresh(now)
            cooling = self.loop.cooling.status()
        snapshot = dataclasses.replace(snapshot, seconds_to_throttle=forecast, cooling=cooling)
        return status.document(
            snapshot,
            stats,
            self.daemon_stats(),
            self.loop.timing.summary(),
            self.serving.info(),
            joules,
            self.telemetry.info(),
            placement=self.placement(),
        )

    def placement(self) -> PlacementDoc:
        """The placement plan of the configuration in force (made again after a reload only)."""
        made_for, doc = self._placed
        if made_for is not self.config:
            doc = self.planner(self.config).doc()
            self._placed = (self.config, doc)
        return doc

    def command(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Allow-listed runtime commands (called on the telemetry thread): pause or resume the
        governor, or switch it to one of the config's [governor.profiles]. Anything else is refused.
        """
        result: dict[str, Any]
        if name in ("pause", "resume"):
            self.loop.paused = name == "pause"
            result = {"paused": self.loop.paused}
            message = f"governor {name}d by command"
        elif name == "profile":
            with self._settings_lock:
                known = ["default", *self.config.governor.profiles]
                profile = args.get("name")
                if profile not in known:
                    return {
                        "ok": False,
                        "error": f"unknown profile {profile!r}; defined: {', '.join(known)}",
                    }
                self.profile = str(profile)
                self.loop.request_reload(LoopSettings.from_config(self.config, self.profile))
            result = {"profile": self.profile}
            message = f"governor profile {self.profile!r} set by command"
        else:
            allowed = ", ".join(COMMANDS)
            return {"ok": False, "error": f"unknown command {name!r}; allowed: {allowed}"}
        log.info(message)
        self.events.publish(Event("daemon", message, {"command": name, **result}))
        return {"ok": True, **result}

    def _on_status(self, snapshot: Snapshot) -> None:
        if self.live is None:
            return
        served = []
        for name, stats in self.model_stats().items():
            rate = stats.requests - self._requests_seen.get(name, stats.requests)
            self._requests_seen[name] = stats.requests
            latency = "" if stats.p50_ms is None else f" p50 {stats.p50_ms:.1f} ms"
            served.append(f"{name} {rate} req/s{latency}")
        tail = f" | {', '.join(served)}" if served else ""
        self.live(f"t+{time.monotonic() - self._started:5.0f}s  {status.line(snapshot)}{tail}")

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> int:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        loop.add_signal_handler(signal.SIGINT, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload.set)
        stop_loop = threading.Event()
        thread = threading.Thread(
            target=self._govern, args=(stop_loop, loop), name="control-loop", daemon=True
        )
        code = 0
        # The calling thread is the governor's; it gets its CPUs back when run() returns, which
        # matters to a caller that goes on (the tests run daemons in their own process).
        with affinity.pinned(self._place(), "the governor"):
            try:
                # The first touch of the hardware, inside the try whose finally restores the
                # caps; and the first samples before the services start, so that the first status
                # document they publish has the board in it, and the first tick does not share the
                # interpreter with their start (the serving process spawned, the first status
                # built): it was the run's slowest sample-to-write.
                self.loop.start()
                thread.start()
                if not await loop.run_in_executor(None, self.loop.ready.wait, READY_TIMEOUT_S):
                    log.error("no samples within %g s; giving up", READY_TIMEOUT_S)
                    return 1
                for service in self.services:
                    await service.start()
                self.notifier.ready(status.line(self.loop.snapshot))
                self._announce()
                code = await self._main()
            finally:
                self.notifier.stopping()
                for service in reversed(self.services):
                    await _stop(service)
                stop_loop.set()
                if thread.is_alive():
                    thread.join(timeout=5)
                self._restore()
                self.notifier.close()
        return code

    def _place(self) -> tuple[int, ...]:
        """The CPUs the governor runs on, before the control loop's thread and the services' (they
        inherit them); the plan said once, with what of it is skipped here."""
        plan = self.planner(self.config)
        log.info("placement: %s", plan.note)
        parts: dict[str, Placement | ModelPlacement] = {
            "the governor": plan.governor,
            "serving's loop": plan.serving_loop,
        }
        parts.update({f"model {name}": model for name, model in plan.models.items()})
        for what, part in parts.items():
            if part.skipped is not None and plan.mode == "auto":
                log.warning("placement: %s not placed: %s", what, part.skipped)
        return plan.governor.cpus if plan.governor.skipped is None else ()

    def _govern(self, stop: threading.Event, main: asyncio.AbstractEventLoop) -> None:
        """The control loop's thread. Its end wakes the main task, which has no timer to look for
        it with (a wake-up a second to ask was a twentieth of the idle governor's CPU)."""
        try:
            self.loop.run(stop)
        finally:
            with contextlib.suppress(RuntimeError):  # the event loop is already closed
                main.call_soon_threadsafe(self._loop_ended.set)

    async def _main(self) -> int:
        while not self._stop.is_set():
            waiters = {
                asyncio.create_task(self._stop.wait()),
                asyncio.create_task(self._reload.wait()),
                asyncio.create_task(self._loop_ended.wait()),
            }
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            if self._loop_ended.is_set():
                log.critical("the control loop thread ended; exiting so that systemd restarts mcpd")
                return 1
            if self._reload.is_set() and not self._stop.is_set():
                self._reload.clear()
                await self.reload()
        log.info("stopping")
        return 0

    def _announce(self) -> None:
        snapshot = self.loop.snapshot
        names = ", ".join(d.name for d in snapshot.domains) or "none"
        plan = self.loop.sensors.power_plan
        scheduling = self.daemon_stats.scheduling
        (log.info if not scheduling.startswith("normal") else log.warning)(
            "governor scheduling: %s", scheduling
        )
        log.info(
            "ready: %s%s; %d temperature sensors, power: %s; domains: %s",
            self.board.platform,
            f" ({self.board.model})" if self.board.model else "",
            len(snapshot.temperatures),
            plan.reason,
            names,
        )
        self.events.publish(Event("daemon", "mcpd started", {"platform": self.board.platform}))

    async def reload(self) -> None:
        """Apply the config file as it is now, or reject it whole; either way the verdict goes to
        `mcpd reload` (systemd's ExecReload), which waits for it."""
        began = time.monotonic()
        self.notifier.reloading()
        try:
            new = self.load_config()
        except config.ConfigError as exc:
            self._reject(began, exc.problems, str(exc))
            return
        except Exception as exc:  # nothing a file holds may end the daemon
            log.exception("reading the configuration failed")
            self._reject(began, [repr(exc)], f"unexpected error: {exc!r}")
            return
        kept = [
            key
            for key in RESTART_ONLY
            if getattr(new.daemon, key) != getattr(self.config.daemon, key)
        ]
        if kept:
            log.warning(
                "reload: [daemon] %s change only on restart; keeping the running values",
                ", ".join(kept),
            )
            fixed = {key: getattr(self.config.daemon, key) for key in RESTART_ONLY}
            new = dataclasses.replace(new, daemon=dataclasses.replace(new.daemon, **fixed))
        with self._settings_lock:
            if self.profile not in ("default", *new.governor.profiles):
                log.warning(
                    "reload: profile %r is gone; using %r", self.profile, new.governor.profile
                )
                self.profile = new.governor.profile
            self.loop.request_reload(LoopSettings.from_config(new, self.profile))
            self.config = new
        if self.follow_log_level:
            logging.getLogger().setLevel(new.daemon.log_level.upper())
        for service in self.services:
            try:
                await service.reload(new)
            except Exception:
                log.exception("reload of %s failed; it keeps its previous settings", service.name)
        log.info("configuration reloaded")
        self.events.publish(Event("daemon", "configuration reloaded"))
        self.notifier.ready(status.line(self.loop.snapshot))
        verdict = reloading.Verdict(os.getpid(), began, True, "configuration reloaded")
        reloading.write(Path(self.config.daemon.runtime_dir), verdict)

    def _reject(self, began: float, problems: list[str], text: str) -> None:
        # One journal line: the problems joined, so that `journalctl -p err` shows all of them.
        log.error(
            "reload rejected, the running configuration stays in force: %s",
            text.replace("\n", "; "),
        )
        self.events.publish(Event("daemon", "reload rejected", {"problems": problems}))
        self.notifier.ready(status.line(self.loop.snapshot))
        verdict = reloading.Verdict(os.getpid(), began, False, text)
        reloading.write(Path(self.config.daemon.runtime_dir), verdict)

    def _restore(self) -> None:
        # Only what it adopted: a daemon that stops before adopting (or leaves a domain alone by
        # config) never writes to a domain it did not govern.
        report = self.baseline.restore(domains.discover(self.root), only=self.baseline.adopted)
        if report.restored:
            log.info("baseline caps restored: %s", ", ".join(report.restored))
        for problem in report.problems:
            log.error("restore: %s", problem)


async def _stop(service: Service) -> None:
    try:
        await service.stop()
    except Exception:
        log.exception("stopping %s failed", service.name)
