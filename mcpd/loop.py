"""The control loop: sample, decide, actuate, on deadlines from a monotonic clock.

Temperature is sampled every `temperature_ms` and power every `power_ms`; every sample is decided on
at once with the newest value of the other signal. Deadlines advance on a fixed grid (work done in
between never makes the schedule drift; a late wake-up skips the ticks it missed instead of
bursting). A temperature older than `stale_ms` (or a power meter silent that long) is unknown and
the governor steps down until it is back. The loop pings systemd's watchdog from its own tick, so a
hung loop is caught, and it never stops on a sensor fault: vanished files and udev events trigger
re-discovery.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from governors import (
    Action,
    AdaptivePolicy,
    DomainSteps,
    HysteresisGovernor,
    Level,
    RaiseHold,
    Readings,
    Verdict,
    allowed_mhz,
    uniform_levels,
)
from mcpd import competitors, domains, status
from mcpd.actuation import Actuators, CapChange
from mcpd.baseline import Baseline
from mcpd.board import Board
from mcpd.config import Config, DomainSection
from mcpd.events import Event, EventBus
from mcpd.notify import Notifier
from mcpd.state import DomainStatus, LastAction, Snapshot
from mcpd.thermal_forecast import ThrottleForecast, headroom
from sensors import PowerSample, SensorSet, TemperatureSample
from sensors.discovery import PowerOptions
from sensors.hotplug import HotplugMonitor

log = logging.getLogger("mcpd.loop")

GIL_SWITCH_INTERVAL_S = 0.0005
"""For sys.setswitchinterval in the daemon: inference threads run Python between onnxruntime calls,
and at the default 5 ms the control loop could wait that long for the interpreter lock before it
samples (bench/control_loop.py: sample lateness p99 5.5 ms with inference in the process)."""

HOUSEKEEPING_S = 1.0
"""How often current clocks are read back, STATUS= is sent and the live line printed."""


@dataclass(frozen=True)
class LoopSettings:
    temperature_s: float = 0.2
    power_s: float = 0.1
    stale_s: float = 1.0
    governor: HysteresisGovernor = field(default_factory=HysteresisGovernor)
    policy: str = "hysteresis"
    """"hysteresis" (the seed rule, `governor`) or "adaptive" (`adaptive`, same thresholds)."""
    adaptive: AdaptivePolicy = field(default_factory=AdaptivePolicy)
    raise_hold_s: float = 0.0
    domain_overrides: Mapping[str, DomainSection] = field(default_factory=dict)
    models: Mapping[str, int] = field(default_factory=dict)
    """Model name -> max_batch."""
    governing_temperatures: tuple[str, ...] = ()
    governing_powers: tuple[str, ...] = ()
    power: PowerOptions = field(default_factory=PowerOptions)
    rescan_s: float = 10.0
    """Periodic re-discovery where no udev monitor runs (fake trees, containers)."""
    profile: str = "default"

    @classmethod
    def from_config(cls, config: Config, profile: str | None = None) -> LoopSettings:
        """Settings from a config, with one of its governor profiles (default: the configured one)."""
        profile = profile or config.governor.profile
        g = config.governor.tuned(profile)
        return cls(
            temperature_s=config.sampling.temperature_ms / 1000,
            power_s=config.sampling.power_ms / 1000,
            stale_s=config.sampling.stale_ms / 1000,
            governor=HysteresisGovernor(
                g.temp_high_c,
                g.temp_low_c,
                g.power_high_w,
                g.power_low_w,
                g.down_factor,
                g.up_factor,
                g.min_mhz,
                g.max_mhz,
            ),
            policy=g.policy,
            adaptive=AdaptivePolicy(g.temp_high_c, g.power_high_w, g.down_factor),
            raise_hold_s=g.raise_hold_ms / 1000,
            domain_overrides=dict(g.domains),
            models={model.name: model.max_batch for model in config.models},
            governing_temperatures=config.sensors.governing_temperatures,
            governing_powers=config.sensors.governing_powers,
            power=config.sensors.power_options(),
            profile=profile,
        )


class Durations:
    """Durations counted in log-spaced buckets 2 % wide (1 µs to about a minute): percentiles of a
    whole run, start-up included, in constant memory and constant time per sample, to within 2 %;
    the maximum exactly. Appended by the loop, read by any thread."""

    _LOW_S = 1e-6
    _RATIO = 1.02
    _BUCKETS = int(math.log(60 / _LOW_S, _RATIO)) + 2

    def __init__(self) -> None:
        self._counts = [0] * self._BUCKETS
        self._count = 0
        self.max_s = 0.0

    def __len__(self) -> int:
        return self._count

    def clear(self) -> None:
        self._counts = [0] * self._BUCKETS
        self._count = 0
        self.max_s = 0.0

    def append(self, seconds: float) -> None:
        if seconds <= self._LOW_S:
            bucket = 0
        else:
            bucket = min(self._BUCKETS - 1, 1 + int(math.log(seconds / self._LOW_S, self._RATIO)))
        self._counts[bucket] += 1
        self._count += 1
        self.max_s = max(self.max_s, seconds)

    def quantile(self, q: float) -> float:
        """The upper edge of the bucket holding the q-th sample (never above the maximum)."""
        rank = max(1, math.ceil(q * self._count))
        seen = 0
        for bucket, count in enumerate(self._counts):
            seen += count
            if seen >= rank:
                return min(self._LOW_S * self._RATIO**bucket, self.max_s)
        return self.max_s

    def summary(self) -> dict[str, float] | None:
        if not self._count:
            return None

        def ms(seconds: float) -> float:
            return round(seconds * 1000, 3)

        return {
            "p50_ms": ms(self.quantile(0.5)),
            "p99_ms": ms(self.quantile(0.99)),
            "max_ms": ms(self.max_s),
            "count": self._count,
        }


class LoopTiming:
    """How late samples are taken and how long a sample takes to become a cap write, over the whole
    run: the loop's own health, reported in the status document and measured by bench/."""

    def __init__(self) -> None:
        self.lateness_s = Durations()
        self.sample_to_write_s = Durations()

    def summary(self) -> dict[str, dict[str, float] | None]:
        return {
            "sample_lateness": self.lateness_s.summary(),
            "sample_to_write": self.sample_to_write_s.summary(),
        }


def next_deadline(deadline: float, period: float, now: float) -> float:
    """The next grid point after `now`, skipping any that were missed."""
    deadline += period
    if deadline <= now:
        deadline += ((now - deadline) // period + 1) * period
    return deadline


class ControlLoop:
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
        self.hotplug = hotplug
        self.on_status = on_status
        self.clock = clock
        self.wall = wall
        self.timing = LoopTiming()
        self.ready = threading.Event()
        """Set once the first samples are in (READY=1)."""
        self.paused = False
        self._pending: LoopSettings | None = None
        self._hold = RaiseHold(settings.raise_hold_s)
        self._batch = dict(settings.models)
        self._temp: tuple[float, float] | None = None
        self._power: tuple[float, float] | None = None
        self._unknown: set[str] = set()
        self._temp_sample = TemperatureSample((), None)
        self._power_sample = PowerSample((), None, False)
        self._forecast = ThrottleForecast()
        self._energy_j: float | None = None
        self._last_action: LastAction | None = None
        self._state = "starting"
        self._caps: dict[str, float | None] = {}
        self._curs: dict[str, float | None] = {}
        self._ungoverned: str | None = None
        """What is missing for governing (no temperature sensor, no frequency domain), if any."""
        now = clock()
        self._started = now
        self._floor_warned: set[str] = set()
        self._trips_checked = False
        self._external_changes = 0
        self._next_temp = self._next_power = self._next_housekeeping = now
        self._next_ping = now
        self._last_scan = now
        self.sensors = self._discover_sensors()
        self.actuators = Actuators(events, baseline)
        self._levels: tuple[Level, ...] = ()
        self._adaptive = settings.adaptive.start(())
        self._sync_domains()
        self._check_governable()
        self.snapshot = self._build_snapshot()

    # -- public, thread-safe ---------------------------------------------------------------------

    def batch_size(self, model: str) -> int:
        return self._batch.get(model, 1)

    @property
    def batch_sizes(self) -> Mapping[str, int]:
        """Every model's batch size; a new mapping (never changed in place) after each change."""
        return self._batch

    def request_reload(self, settings: LoopSettings) -> None:
        """Applied whole at the start of the next tick, never half-way through a decision."""
        self._pending = settings

    def run(self, stop: threading.Event) -> None:
        quiet_until = 0.0
        while not stop.is_set():
            try:
                wake = self.tick(self.clock())
            except Exception:  # a bug must not end governing; the watchdog sees no ping
                now = self.clock()
                if now >= quiet_until:
                    log.exception("control loop tick failed; continuing")
                    quiet_until = now + 10.0
                wake = now + 0.1
            # time.sleep rather than stop.wait: one system call instead of a condition variable and
            # a fresh lock per wait, which was a fifth of the idle loop's CPU. Stopping waits for
            # the current sleep, at most one sampling period.
            time.sleep(max(0.0, wake - self.clock()))

    # -- one tick --------------------------------------------------------------------------------

    def tick(self, now: float) -> float:
        """Do whatever is due at `now`; return when the next thing is due."""
        if self._pending is not None:
            self._apply_settings(self._pending, now)
        sampled = False
        started = self.clock()
        if now >= self._next_temp:
            self.timing.lateness_s.append(started - self._next_temp)
            self._temp_sample = self.sensors.sample_temperatures()
            if self._temp_sample.celsius is not None:
                self._temp = (self._temp_sample.celsius, now)
                self._forecast.add(now, self._temp_sample.celsius)
            self._next_temp = next_deadline(self._next_temp, self.settings.temperature_s, now)
            sampled = True
        if self.sensors.powers and now >= self._next_power:
            self.timing.lateness_s.append(self.clock() - self._next_power)
            self._power_sample = self.sensors.sample_powers(now)
            if self._power_sample.watts is not None:
                self._add_energy(self._power_sample.watts, now)
                self._power = (self._power_sample.watts, now)
                self._forecast.add_power(now, self._power_sample.watts)
            self._next_power = next_deadline(self._next_power, self.settings.power_s, now)
            sampled = True
        if sampled:
            written = self._decide(now)
            if written is not None:
                self.timing.sample_to_write_s.append(written - started)
            if not self.ready.is_set():
                self.ready.set()
        # After the samples, so that re-discovery (milliseconds) never makes one late.
        self._maybe_rediscover(now)
        if now >= self._next_housekeeping:
            self._housekeeping()
            self._next_housekeeping = next_deadline(self._next_housekeeping, HOUSEKEEPING_S, now)
        interval = self.notifier.watchdog_interval_s
        if interval is not None and now >= self._next_ping:
            self.notifier.watchdog()
            self._next_ping = now + interval
        wake = min(self._next_temp, self._next_housekeeping)
        if self.sensors.powers:
            wake = min(wake, self._next_power)
        if interval is not None:
            wake = min(wake, self._next_ping)
        return wake

    def _fresh(self, sample: tuple[float, float] | None, now: float) -> float | None:
        if sample is None or now - sample[1] > self.settings.stale_s:
            return None
        return sample[0]

    def _readings(self, now: float) -> Readings:
        metered = self.sensors.power_plan.metered
        temp = self._fresh(self._temp, now)
        power = self._fresh(self._power, now) if metered else None
        # A meter that has not produced its first reading yet (RAPL needs two energy samples) is
        # not a failed one: govern by temperature alone until it has had stale_s to produce one.
        first_pending = self._power is None and now - self._started <= self.settings.stale_s
        metered = metered and not first_pending
        self._note_unknown("temperature", temp is None and self._temp is not None)
        self._note_unknown("power", metered and power is None)
        return Readings(temp, power, metered)

    def _note_unknown(self, signal: str, unknown: bool) -> None:
        if unknown and signal not in self._unknown:
            self._unknown.add(signal)
            message = f"{signal} unknown: no valid reading for {self.settings.stale_s:g} s; stepping down (fail-safe)"
            log.warning(message)
            self.events.publish(
                Event("fault", message, {"signal": signal, "stale_s": self.settings.stale_s})
            )
        elif not unknown and signal in self._unknown:
            self._unknown.discard(signal)
            log.info("%s readings are back", signal)
            self.events.publish(
                Event("fault", f"{signal} readings are back", {"signal": signal, "recovered": True})
            )

    def _decide(self, now: float) -> float | None:
        """Decide on the newest readings; when a cap was written, the clock right after the write
        (logs and events come after it and never delay it)."""
        readings = self._readings(now)
        changes: list[CapChange] = []
        written = None
        governor = self.settings.governor
        verdict = governor.verdict(readings)
        if self.paused:
            self._state = "paused"
        else:
            if self.settings.policy == "adaptive":
                verdict, changes = self._adapt(readings, now)
            else:
                verdict, self._hold = self._hold.apply(verdict, now)
                changes = self.actuators.apply(governor, verdict)
            if changes:
                written = self.clock()
            self._check_power_floor(readings)
            for change in changes:
                self._caps[change.domain] = change.new_mhz
            batch = self._step_batches(verdict)
            if changes or batch:
                self._report(verdict, changes, batch, readings)
            unknown = readings.temp_c is None or (readings.metered and readings.power_w is None)
            states = {Action.LOWER: "lowering", Action.RAISE: "raising", Action.HOLD: "holding"}
            self._state = "fail-safe" if unknown else states[verdict.action]
            if not self.actuators.controls:
                self._state = "ungoverned"
        self.snapshot = self._build_snapshot()
        return written

    def _add_energy(self, watts: float, now: float) -> None:
        """Board energy since start: each reading held until the next, a gap (a silent meter)
        counted for at most `stale_s`."""
        if self._power is None or self._energy_j is None:
            self._energy_j = 0.0
            return
        self._energy_j += watts * min(now - self._power[1], self.settings.stale_s)

    def _adapt(self, readings: Readings, now: float) -> tuple[Verdict, list[CapChange]]:
        policy = self.settings.adaptive
        if self._temp is not None and readings.temp_c is not None:
            self._adaptive = policy.observe(self._adaptive, *self._temp)
        before = self._adaptive.level
        verdict, self._adaptive = policy.decide(self._adaptive, readings, now, self._levels)
        if self._adaptive.level == before or not self._levels:
            return verdict, []
        return verdict, self.actuators.set_targets(
            dict(self._levels[self._adaptive.level].caps_mhz)
        )

    def _check_power_floor(self, readings: Readings) -> None:
        """Say once per signal when a limit cannot be met inside the clamp."""
        g = self.settings.governor
        controls = self.actuators.controls.values()
        for signal, value, limit, unit in (
            ("power", readings.power_w, g.power_high_w, "W"),
            ("temperature", readings.temp_c, g.temp_high_c, "°C"),
        ):
            if signal in self._floor_warned or value is None:
                continue
            if competitors.warn_if_floor_over_limit(
                controls, signal, value, limit, unit, self.events
            ):
                self._floor_warned.add(signal)

    def _step_batches(self, verdict: Verdict) -> dict[str, tuple[int, int]]:
        changed: dict[str, tuple[int, int]] = {}
        if verdict.action is Action.HOLD:
            return changed
        batch = dict(self._batch)
        for model, max_batch in self.settings.models.items():
            old = batch.get(model, max_batch)
            new = int(self.settings.governor.step_batch(verdict, old, max_batch).new)
            if new != old:
                batch[model] = new
                changed[model] = (old, new)
        if changed:
            self._batch = batch  # one reference swap: the batcher never sees a half-updated dict
        return changed

    def _report(
        self,
        verdict: Verdict,
        changes: list[CapChange],
        batch: dict[str, tuple[int, int]],
        readings: Readings,
    ) -> None:
        def mhz(value: float | None) -> str:
            return "?" if value is None else f"{value:.0f}"

        parts = [f"{c.domain} {mhz(c.old_mhz)} -> {mhz(c.new_mhz)} MHz" for c in changes]
        parts += [f"batch {model} {old} -> {new}" for model, (old, new) in batch.items()]
        message = f"{verdict.action.value}: {', '.join(parts)} ({verdict.reason})"
        log.info(message)
        self._last_action = LastAction(verdict.action.value, verdict.reason, self.wall())
        data = {
            "action": verdict.action.value,
            "reason": verdict.reason,
            "caps": {c.domain: {"old_mhz": c.old_mhz, "new_mhz": c.new_mhz} for c in changes},
            "batch": {model: {"old": old, "new": new} for model, (old, new) in batch.items()},
            "temperature_c": readings.temp_c,
            "power_w": readings.power_w,
        }
        self.events.publish(Event("governor", message, data))

    # -- discovery and settings ------------------------------------------------------------------

    def _discover_sensors(self) -> SensorSet:
        s = self.settings
        return SensorSet.discover(self.root, s.governing_temperatures, s.governing_powers, s.power)

    def _sync_domains(self) -> None:
        g = self.settings.governor
        found = domains.discover(self.root)
        changes = self.actuators.sync(found, g.min_mhz, g.max_mhz, self.settings.domain_overrides)
        for change in changes:
            self._caps[change.domain] = change.new_mhz
            log.info(
                "%s: cap %s -> %.0f MHz (into the configured range)",
                change.domain,
                change.old_mhz,
                change.new_mhz,
            )
        self._update_levels()
        self._read_clocks()

    def _update_levels(self) -> None:
        """The adaptive policy's levels from the domains' tables and ranges; when they change,
        it continues from the highest level not above the one it was at."""
        steps = [
            DomainSteps(name, c.domain.max_mhz, allowed_mhz(c.domain.available_mhz, c.low, c.high))
            for name, c in self.actuators.controls.items()
        ]
        levels = uniform_levels(steps)
        if levels == self._levels:
            return
        fraction = self._levels[self._adaptive.level].fraction if self._levels else 1.0
        level = max((i for i, lv in enumerate(levels) if lv.fraction <= fraction), default=0)
        self._levels = levels
        self._adaptive = replace(self._adaptive, level=level)

    def _read_clocks(self) -> None:
        controls = self.actuators.controls
        expected = self._caps
        self._caps = {name: c.domain.read_cap_mhz() for name, c in controls.items()}
        self._notice_external_caps(expected)
        self._curs = {name: c.domain.read_cur_mhz() for name, c in controls.items()}

    def _maybe_rediscover(self, now: float) -> None:
        hotplug = self.hotplug is not None and self.hotplug.changed()
        vanished = now - self._last_scan >= 1.0 and self.sensors.gone
        periodic = self.hotplug is None and now - self._last_scan >= self.settings.rescan_s
        if not (hotplug or vanished or periodic):
            return
        self._last_scan = now
        found = self._discover_sensors()
        self._sync_domains()
        if found.signature != self.sensors.signature:
            self._rediscovered(found, hotplug, vanished)
        self._check_governable()

    def _check_governable(self) -> None:
        """Say loudly, once per change, when there is nothing to govern by or nothing to govern:
        a daemon that only says "ready" there would leave the board unprotected unnoticed."""
        missing = [
            what
            for what, absent in (
                ("temperature sensor", not self.sensors.governing_names),
                ("frequency domain", not self.actuators.controls),
            )
            if absent
        ]
        now = " and no ".join(missing) or None
        if now == self._ungoverned:
            return
        if now is not None:
            effect = (
                "no cap can be written"
                if not self.actuators.controls
                else "every cap is held at its floor (fail-safe)"
            )
            message = f"nothing is governed: no {now} found under {self.root}; {effect}"
            log.warning(message)
        else:
            message = "governing again: temperature sensors and frequency domains found"
            log.info(message)
        self.events.publish(Event("fault", message, {"missing": missing}))
        self._ungoverned = now

    def _rediscovered(self, found: SensorSet, hotplug: bool, vanished: bool) -> None:
        self.sensors = found
        why = (
            "udev event" if hotplug else "a sensor file vanished" if vanished else "devices changed"
        )
        message = f"sensors re-discovered ({why}): {len(found.temperatures)} temperatures, {len(found.powers)} powers"
        log.info(message)
        self.events.publish(Event("fault", message, {"reason": why}))

    def _apply_settings(self, settings: LoopSettings, now: float) -> None:
        self._pending = None
        old, self.settings = self.settings, settings
        if (old.governing_temperatures, old.governing_powers, old.power) != (
            settings.governing_temperatures,
            settings.governing_powers,
            settings.power,
        ):
            self.sensors = self._discover_sensors()
        self._sync_domains()
        self._hold = RaiseHold(settings.raise_hold_s)
        if settings.policy != old.policy or settings.adaptive != old.adaptive:
            self._adaptive = replace(
                settings.adaptive.start(self._levels), level=self._adaptive.level
            )
        self._batch = {
            name: min(self._batch.get(name, top), top) for name, top in settings.models.items()
        }
        if (old.temperature_s, old.power_s) != (settings.temperature_s, settings.power_s):
            self._next_temp = self._next_power = now
        self._check_governable()
        log.info("control loop settings reloaded")

    # -- competing controllers -------------------------------------------------------------------

    def _check_kernel_trips(self) -> None:
        competitors.warn_about_kernel_trips(
            self.root, self.settings.governor.temp_high_c, self.events
        )

    def _notice_external_caps(self, expected: Mapping[str, float | None]) -> None:
        controls = self.actuators.controls
        self._external_changes += competitors.follow_external_caps(
            controls, expected, self._caps, self.events
        )

    # -- status ----------------------------------------------------------------------------------

    def _housekeeping(self) -> None:
        if self.baseline is not None:
            self.baseline.keep()  # a copy lost with a full disk or a removed folder is saved again
        if not self._trips_checked:
            self._trips_checked = True
            self._check_kernel_trips()
        self._read_clocks()
        self.snapshot = self._build_snapshot()
        self.notifier.status(status.line(self.snapshot))
        if self.on_status is not None:
            self.on_status(self.snapshot)

    def _build_snapshot(self) -> Snapshot:
        power = self._power_sample
        return Snapshot(
            ts=self.wall(),
            platform=self.board.platform,
            model=self.board.model,
            temperature_c=self._temp_sample.celsius,
            power_w=power.watts,
            power_estimated=self.sensors.power_plan.estimated,
            metered=self.sensors.power_plan.metered,
            power_source=self.sensors.power_plan.source,
            temperatures={r.name: r.celsius for r in self._temp_sample.readings},
            powers={r.name: r.watts for r in power.readings},
            domains=tuple(
                DomainStatus(
                    name,
                    c.domain.kind,
                    self._caps.get(name),
                    self._curs.get(name),
                    c.target,
                    c.low,
                    c.high,
                )
                for name, c in self.actuators.controls.items()
            ),
            state=self._state,
            profile=self.settings.profile,
            last_action=self._last_action,
            batch=dict(self._batch),
            headroom=headroom(self._temp_sample.celsius, self.settings.governor.temp_high_c),
            energy_j=self._energy_j,
            seconds_to_throttle=self._forecast.seconds_to(
                self.settings.governor.temp_high_c, self.clock()
            ),
            external_cap_changes=self._external_changes,
            policy=self.settings.policy,
        )
