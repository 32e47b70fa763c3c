"""The control loop: sample, decide, actuate, on deadlines from a monotonic clock.

Temperature is sampled every `temperature_ms` and power every `power_ms`; each tick takes the
samples due then and makes one decision, on the freshest reading of each (the seed rule's one step
per call with both readings: a reading applied once per decision, never twice in one instant).
Deadlines advance on fixed grids (work done in between never makes the schedule drift; a late
wake-up skips the ticks it missed instead of bursting). A temperature older than `stale_ms` (or a
power meter silent that long) is unknown and the governor steps down until it is back. The loop
pings systemd's watchdog from its own tick, so a hung loop is caught, and it never stops on a
sensor fault: vanished files and udev events trigger re-discovery.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from governors.policy import Action, Readings, Verdict
from mcpd import status
from mcpd.events import Event, EventBus
from mcpd.governor import competitors, domains, reports
from mcpd.governor import snapshot_builder as snapshots
from mcpd.governor.actuation import Actuators, CapChange
from mcpd.governor.baseline import Baseline
from mcpd.governor.board import Board
from mcpd.governor.cooling import CoolingWatch
from mcpd.governor.cooling_store import CoolingStore
from mcpd.governor.decisions import BatchSizes, PolicyDriver
from mcpd.governor.energy import BoardEnergy
from mcpd.governor.freshness import Freshness
from mcpd.governor.loop_settings import LoopSettings
from mcpd.governor.notify import Notifier
from mcpd.governor.power_map import PowerMapStore
from mcpd.governor.readback import Readback
from mcpd.governor.rediscovery import Governability, RediscoveryTrigger
from mcpd.governor.thermal_forecast import ThrottleForecast
from mcpd.governor.timing import Grid, LoopTiming
from mcpd.snapshot import LastAction, Snapshot
from mcpd.status import GovernorState
from sensors import PowerSample, SensorSet, TemperatureSample
from sensors.episodes import Repeats
from sensors.hotplug import HotplugMonitor

log = logging.getLogger("mcpd.governor.loop")

GIL_SWITCH_INTERVAL_S = 0.0005
"""For sys.setswitchinterval in the daemon: inference threads run Python between onnxruntime calls,
and at the default 5 ms the control loop could wait that long for the interpreter lock before it
samples (bench/control_loop.py: sample lateness p99 5.5 ms with inference in the process)."""

HOUSEKEEPING_S = 1.0
"""How often current clocks are read back, STATUS= is sent and the live line printed, vanished
sensor files are looked for, and the sensors that do not govern (only reported) are read."""

STATES: dict[Action, GovernorState] = {
    Action.LOWER: "lowering",
    Action.RAISE: "raising",
    Action.HOLD: "holding",
}


def governor_state(
    verdict: Verdict, readings: Readings, governed: bool, failing: bool
) -> GovernorState:
    """What the status says the governor does: never "lowering" while the kernel refuses the
    caps (`failing`), since nothing is lowered then."""
    if not governed:
        return "ungoverned"
    if readings.temp_c is None or (readings.metered and readings.power_w is None):
        return "fail-safe"
    return "write-failing" if failing else STATES[verdict.action]


class ControlLoop:
    """The composition: scheduling, and the order in which the parts act on each sample.

    Nothing here touches the hardware before `start()` (called by `run()`, or by the first
    `tick()`): the owner puts the code that restores the caps in place first.
    """

    def __init__(
        self,
        root: str | Path,
        board: Board,
        settings: LoopSettings,
        *,
        events: EventBus,
        baseline: Baseline | None,
        notifier: Notifier | None = None,
        hotplug: HotplugMonitor | None = None,
        power_map: PowerMapStore | None = None,
        cooling_store: CoolingStore | None = None,
        on_status: Callable[[Snapshot], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(root)
        self.board = board
        self.settings = settings
        self.events = events
        self.baseline = baseline
        self.notifier = notifier or Notifier({})
        self.power_map = power_map
        """Where the adaptive policy's learned power is kept across restarts (metered boards)."""
        self._power_map_loaded = False
        self.on_status = on_status
        self.clock = clock
        self.wall = wall
        self.timing = LoopTiming()
        self.ready = threading.Event()
        """Set once the first samples are in (READY=1)."""
        self.started = False
        self._grid_started = False
        self.paused = False
        self._pending: LoopSettings | None = None
        self.sensors = SensorSet([], [])
        self.actuators = Actuators(events, baseline, wall)
        self.policy = PolicyDriver(settings.governing)
        self._batch = BatchSizes(settings.models)
        self._clocks = Readback(events)
        now = clock()
        self._rediscovery = RediscoveryTrigger(hotplug, now)
        self._governable = Governability(self.root)
        self._temp_sample = TemperatureSample((), None)
        self._power_sample = PowerSample((), None, False)
        self.forecast = ThrottleForecast()
        """Fed here with every sample; asked for its forecast by the status path, off this
        thread (the fit costs milliseconds)."""
        self.cooling = CoolingWatch(events, cooling_store, settings.cooling, clock, wall)
        """Fed here with every governing reading; its windows are fitted by the status path, off
        this thread (mcpd/governor/cooling.py)."""
        self._energy = BoardEnergy()
        self._last_action: LastAction | None = None
        self._state: GovernorState = "starting"
        self._floor = competitors.FloorLimits(events)
        self._trips_checked = False
        self._start_grid(now)
        self._sampled_at = now

    # -- public, thread-safe ---------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The loop's state now, built when read (by status readers on any thread, a few times a
        second) rather than after every sample (ten times a second: a seventh of the idle loop's
        CPU). Safe from any thread: the loop replaces the parts it reads whole, or sets them in
        one assignment, and the domain controls are copied in one step."""
        s = self.settings
        return snapshots.build(
            ts=self.wall() - (self.clock() - self._sampled_at),  # of the newest sample
            board=self.board,
            sensors=self.sensors,
            temperature=self._temp_sample,
            power=self._power_sample,
            controls=dict(self.actuators.controls),
            clocks=self._clocks,
            state=self._state,
            profile=s.profile,
            policy=s.policy,
            temp_high_c=s.params.temp_high_c,
            last_action=self._last_action,
            batch=self._batch.sizes,
            energy_j=self._energy.joules,
        )

    def batch_size(self, model: str) -> int:
        return self._batch.sizes.get(model, 1)

    @property
    def batch_sizes(self) -> Mapping[str, int]:
        """Every model's batch size; a new mapping (never changed in place) after each change."""
        return self._batch.sizes

    def request_reload(self, settings: LoopSettings) -> None:
        """Applied whole at the start of the next tick, never half-way through a decision."""
        self._pending = settings

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """The first touch of the hardware: discover the sensors and adopt the frequency domains
        (each one's cap goes into the baseline before anything is written to it)."""
        self.started = True
        self.sensors = self._discover_sensors()
        self.cooling.begin(self.board, self.sensors, self.settings.power)
        self._sync_domains()
        self._check_governable()

    def _start_grid(self, now: float) -> None:
        """Every deadline at `now`, and readings aged from it. Started again at the first tick:
        discovery, adoption and the daemon's services starting took milliseconds in which no
        sample was due, and counting them made the first sample of every run the latest."""
        self._ages = Freshness(self.events, now)
        self._rediscovery = RediscoveryTrigger(self._rediscovery.hotplug, now)
        self._temperature_grid = Grid(now, self.settings.temperature_s)
        self._power_grid = Grid(now, self.settings.power_s)
        self._housekeeping_grid = Grid(now, HOUSEKEEPING_S)
        self._next_ping = now

    def run(self, stop: threading.Event) -> None:
        if not self.started:
            self.start()
        failures: Repeats[str] = Repeats(10.0)
        while not stop.is_set():
            try:
                wake = self.tick(self.clock())
            except Exception:  # a bug must not end governing; the watchdog sees no ping
                now = self.clock()
                if failures.say("tick", now) is not None:
                    log.exception("control loop tick failed; continuing")
                wake = now + 0.1
            # time.sleep rather than stop.wait: one system call instead of a condition variable and
            # a fresh lock per wait, which was a fifth of the idle loop's CPU. Stopping waits for
            # the current sleep, at most one sampling period.
            time.sleep(max(0.0, wake - self.clock()))

    # -- one tick --------------------------------------------------------------------------------

    def tick(self, now: float) -> float:
        """Do whatever is due at `now`; return when the next thing is due."""
        if not self.started:
            self.start()
        if not self._grid_started:
            self._start_grid(now)
            self._grid_started = True
        if self._pending is not None:
            self._apply_settings(self._pending, now)
        sampled = False
        started = self.clock()
        # Power first when both are due: read from a meter it costs a fifth of the zones' read
        # (about 40 against 200 us on the simulated Orin Nano), so the temperature sample after it
        # is the less late. An estimate costs about what the zones do, and gains nothing either way.
        if self.sensors.powers and now >= self._power_grid.deadline:
            self.timing.lateness_s.append(self.clock() - self._power_grid.deadline)
            self._power_sample = self.sensors.sample_powers(now)
            if self._power_sample.watts is not None:
                self._ages.power = (self._power_sample.watts, now)
                self._energy.add(self._power_sample.watts, now, self.settings.stale_s)
                self.forecast.add_power(now, self._power_sample.watts)
                self.cooling.add_power(now, self._power_sample.watts)
            self._power_grid.advance(now)
            sampled = True
        if now >= self._temperature_grid.deadline:
            self.timing.lateness_s.append(self.clock() - self._temperature_grid.deadline)
            self._temp_sample = self.sensors.sample_temperatures(now)
            if self._temp_sample.celsius is not None:
                self._ages.temperature = (self._temp_sample.celsius, now)
                self.forecast.add(now, self._temp_sample.celsius)
                self.cooling.add_temperature(now, self._temp_sample.celsius)
            self._temperature_grid.advance(now)
            sampled = True
        if sampled:
            self._sampled_at = now
            written = self._decide(now)
            if written is not None:
                self.timing.sample_to_write_s.append(written - started)
            if not self.ready.is_set():
                self.ready.set()
        # After the samples, so that re-discovery (milliseconds) never makes one late.
        self._maybe_rediscover(now)
        if now >= self._housekeeping_grid.deadline:
            self._housekeeping()
            self._housekeeping_grid.advance(now)
        interval = self.notifier.watchdog_interval_s
        if interval is not None and now >= self._next_ping:
            self.notifier.watchdog()
            self._next_ping = now + interval
        wake = min(self._temperature_grid.deadline, self._housekeeping_grid.deadline)
        if self.sensors.powers:
            wake = min(wake, self._power_grid.deadline)
        if interval is not None:
            wake = min(wake, self._next_ping)
        return wake

    def _decide(self, now: float) -> float | None:
        """Decide on the newest readings; when a cap was written, the clock right after the write
        (logs and events come after it and never delay it)."""
        s = self.settings
        plan = self.sensors.power_plan
        readings = self._ages.readings(now, s.stale_s, plan.metered, plan.source == "estimate")
        written = None
        if self.paused:
            self._state = "paused"
        else:
            self._floor.check(self.actuators.controls.values(), readings, s.params, now)
            verdict, changes = self.policy.decide(readings, now, self.actuators)
            if changes:
                written = self.clock()
            self._clocks.wrote(changes)
            batch = self._batch.step(s.governing, verdict, s.models)
            if changes or batch:
                self._report(verdict, changes, batch, readings)
            self._state = governor_state(
                verdict, readings, bool(self.actuators.controls), bool(self.actuators.failing)
            )
        return written

    def _report(
        self,
        verdict: Verdict,
        changes: list[CapChange],
        batch: dict[str, tuple[int, int]],
        readings: Readings,
    ) -> None:
        self._last_action = LastAction(verdict.action.value, verdict.reason, self.wall())
        self._say(logging.INFO, reports.action(verdict, changes, batch, readings))

    def _say(self, level: int, event: Event) -> None:
        log.log(level, event.message)
        self.events.publish(event)

    # -- discovery and settings ------------------------------------------------------------------

    def _discover_sensors(self) -> SensorSet:
        s = self.settings
        return SensorSet.discover(
            self.root,
            s.governing_temperatures,
            s.governing_powers,
            s.power,
            others_every_s=HOUSEKEEPING_S,
        )

    def _sync_domains(self) -> None:
        g = self.settings.params
        found = domains.discover(self.root)
        changes = self.actuators.sync(found, g.min_mhz, g.max_mhz, self.settings.domain_overrides)
        self._clocks.wrote(changes)
        for change in changes:
            log.info(
                "%s: cap %s -> %.0f MHz (into the configured range)",
                change.domain,
                change.old_mhz,
                change.new_mhz,
            )
        plan, estimator = self.sensors.power_plan, self.sensors.estimator
        full_load_w = estimator.full_load_w if estimator and plan.source == "estimate" else None
        self.policy.adopt(self.actuators.controls, full_load_w)
        if self.power_map is not None and not self._power_map_loaded and self.actuators.controls:
            self._power_map_loaded = True
            if plan.source == "meter":
                self.policy.seed(self.power_map.load(self._power_fingerprint()), self.clock())
        self._clocks.read(self.actuators.controls)

    def _power_fingerprint(self) -> dict[str, object]:
        """What learned peaks depend on: the board, its meters and its frequency tables."""
        return {
            "platform": self.board.platform,
            "model": self.board.model,
            "meters": sorted(self.sensors.power_plan.names),
            "domains": {
                name: [c.domain.hw_min, c.domain.hw_max, list(c.domain.table)]
                for name, c in sorted(self.actuators.controls.items())
            },
        }

    def _maybe_rediscover(self, now: float) -> None:
        # A vanished file is looked for on housekeeping ticks only: at every sample, the look
        # over every attribute was a tenth of the idle loop's CPU.
        gone = now >= self._housekeeping_grid.deadline and self.sensors.gone
        reason = self._rediscovery.reason(now, gone, self.settings.rescan_s)
        if reason is None:
            return
        found = self._discover_sensors()
        if found.signature != self.sensors.signature:
            self.sensors = found
            self.cooling.begin(self.board, self.sensors, self.settings.power)
            self._say(
                logging.INFO,
                reports.rediscovered(reason, len(found.temperatures), len(found.powers)),
            )
        self._sync_domains()
        self._check_governable()

    def _check_governable(self) -> None:
        event = self._governable.check(
            bool(self.sensors.governing_names), bool(self.actuators.controls)
        )
        if event is not None:
            self._say(logging.WARNING if self._governable.missing else logging.INFO, event)

    def _apply_settings(self, settings: LoopSettings, now: float) -> None:
        self._pending = None
        old, self.settings = self.settings, settings
        if (old.governing_temperatures, old.governing_powers, old.power) != (
            settings.governing_temperatures,
            settings.governing_powers,
            settings.power,
        ):
            self.sensors = self._discover_sensors()
        self.cooling.reload(settings.cooling)
        self.cooling.begin(self.board, self.sensors, self.settings.power)
        self._sync_domains()
        self.policy.reload(settings.governing)
        if settings.policy != old.policy and self._power_map_loaded and self.power_map is not None:
            # A policy taken over at a reload learns from what the board was known to draw.
            self.policy.seed(self.power_map.saved, now)
        self._batch.reload(settings.models)
        if (old.temperature_s, old.power_s) != (settings.temperature_s, settings.power_s):
            self._temperature_grid = Grid(now, settings.temperature_s)
            self._power_grid = Grid(now, settings.power_s)
        self._check_governable()
        log.info("control loop settings reloaded")

    # -- status ----------------------------------------------------------------------------------

    def _housekeeping(self) -> None:
        if self.baseline is not None:
            self.baseline.keep()  # a copy lost with a full disk or a removed folder is saved again
        now = self.clock()
        if (
            self.power_map is not None
            and self._power_map_loaded
            and self.sensors.power_plan.source == "meter"
            and self.power_map.due(now)
        ):
            learned = self.policy.learned_w()
            if learned is not None:
                self.power_map.keep(self._power_fingerprint(), learned, now)
        if not self._trips_checked:
            self._trips_checked = True
            competitors.warn_about_kernel_trips(
                self.root, self.settings.params.temp_high_c, self.events
            )
        self._clocks.read(self.actuators.controls)
        snapshot = self.snapshot
        self.notifier.status(status.line(snapshot))
        if self.on_status is not None:
            self.on_status(snapshot)
