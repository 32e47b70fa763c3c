"""Find every sensor of a board and choose the ones that govern.

The governing temperature is the hottest valid reading among the SoC/CPU sensors; the governing
power is what the board draws where it is measured, else the best estimate, else None (no meter:
most RK3588 boards). Both choices can be overridden by sensor name.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from sensors import estimate, hwmon, ina3221, jetson_iio, rapl, thermal
from sensors.base import (
    INPUT_RAILS,
    PowerReading,
    PowerSensor,
    TemperatureReading,
    TemperatureSensor,
)

log = logging.getLogger("mcpd.sensors")


@dataclass(frozen=True)
class TemperatureSample:
    readings: tuple[TemperatureReading, ...]
    celsius: float | None
    """Governing temperature: the hottest valid governing reading; None when none is valid."""


@dataclass(frozen=True)
class PowerSample:
    readings: tuple[PowerReading, ...]
    watts: float | None
    """Governing power; None when the board has no meter or the meter is unavailable."""
    estimated: bool
    """True when `watts` is a sum of partial rails/packages rather than a board-input meter."""


@dataclass(frozen=True)
class PowerPlan:
    """Which power sensors make the governing power, and how."""

    names: tuple[str, ...]
    estimated: bool
    reason: str

    @property
    def metered(self) -> bool:
        return bool(self.names)

    @property
    def source(self) -> str | None:
        """ "meter", "estimate" (the Energy Model estimator) or None (no power at all)."""
        if not self.names:
            return None
        return "estimate" if self.names == (estimate.NAME,) else "meter"


@dataclass(frozen=True)
class PowerOptions:
    """`[sensors] power`: "auto" (a meter where the board has one, else the estimator), "meter"
    (never estimate) or "estimate" (the estimator even beside a meter, to compare the two; it
    learns its static term from that meter)."""

    mode: str = "auto"
    static_w: float = 4.0
    """The estimator's static term until a meter teaches it better (`estimate_static_w`)."""
    coefficients: Mapping[str, float] = field(default_factory=dict)
    """Domain -> µW/MHz/V², for device-tree nodes without `dynamic-power-coefficient`."""


AUTO_POWER = PowerOptions()


NO_METER = PowerPlan((), False, "no power meter found on this board")


def plan_power(sensors: Sequence[PowerSensor], override: Sequence[str] = ()) -> PowerPlan:
    by_name = {sensor.name: sensor for sensor in sensors}
    if override:
        names = tuple(name for name in override if name in by_name)
        missing = [name for name in override if name not in by_name]
        if missing:
            log.error("configured governing power sensors not found: %s", ", ".join(missing))
        if not names:
            return PowerPlan((), False, "configured governing power sensors not found")
        estimated = not (len(names) == 1 and by_name[names[0]].role == "input")
        return PowerPlan(names, estimated, "configured")
    inputs = [s.name for s in sensors if s.role == "input"]
    if inputs:
        ranked = sorted(inputs, key=lambda n: INPUT_RAILS.index(n) if n in INPUT_RAILS else 99)
        return PowerPlan((ranked[0],), False, f"board input {ranked[0]}")
    rails = tuple(s.name for s in sensors if s.role == "rail")
    if rails:
        # AGX Orin has no input rail; jtop sums the rails too (docs/sysfs.md §1).
        return PowerPlan(rails, True, "sum of rails (no board input rail)")
    packages = tuple(s.name for s in sensors if s.role == "package")
    if packages:
        return PowerPlan(packages, True, "sum of RAPL packages (no psys domain)")
    return NO_METER


def governing_temperature(
    readings: Iterable[TemperatureReading], names: frozenset[str]
) -> float | None:
    valid = [r.celsius for r in readings if r.name in names and r.celsius is not None]
    return max(valid) if valid else None


def governing_power(readings: Iterable[PowerReading], plan: PowerPlan) -> float | None:
    """Sum of the plan's sensors; None if any of them is unavailable (a partial sum would
    understate the power and let the governor raise caps it should not)."""
    if not plan.metered:
        return None
    values = {r.name: r.watts for r in readings if r.name in plan.names}
    if len(values) != len(plan.names) or any(v is None for v in values.values()):
        return None
    return sum(v for v in values.values() if v is not None)


Reading = TypeVar("Reading", TemperatureReading, PowerReading)


class _LastReadings(Generic[Reading]):
    """The newest reading of each sensor of a list: the governing ones read at every sample, the
    others (only reported) at most every `others_every_s`, their last reading kept in between."""

    def __init__(self, count: int, governing: Sequence[int], others_every_s: float) -> None:
        self._last: list[Reading] = []
        self._count = count
        self._governing = governing
        self._others_every_s = others_every_s
        self._others_due = -math.inf

    def refresh(self, read: Callable[[int], Reading], now: float | None) -> tuple[Reading, ...]:
        every = self._others_every_s <= 0 or now is None or now >= self._others_due
        if every or not self._last:
            self._last = [read(index) for index in range(self._count)]
            if now is not None:
                self._others_due = now + self._others_every_s
        else:
            for index in self._governing:
                self._last[index] = read(index)
        return tuple(self._last)


class SensorSet:
    """All temperature and power sensors of one board, found from a sysfs root."""

    def __init__(
        self,
        temperatures: list[TemperatureSensor],
        powers: list[PowerSensor],
        governing_temperatures: Sequence[str] = (),
        governing_powers: Sequence[str] = (),
        estimator: estimate.EstimatedPower | None = None,
        power_mode: str = "auto",
        *,
        others_every_s: float = 0.0,
    ) -> None:
        """`others_every_s`: how often the loop reads the sensors that do not govern (reported in
        the status only); 0 reads every sensor at every sample."""
        self.temperatures = temperatures
        self.powers: list[PowerSensor] = [*powers, *([estimator] if estimator else [])]
        self.estimator = estimator
        if governing_temperatures:
            known = {s.name for s in temperatures}
            missing = [n for n in governing_temperatures if n not in known]
            if missing:
                log.error(
                    "configured governing temperature sensors not found: %s", ", ".join(missing)
                )
            self.governing_names = frozenset(governing_temperatures) & known
        else:
            self.governing_names = frozenset(s.name for s in temperatures if s.governs)
        self.meter_plan = plan_power(powers, governing_powers)
        """What the meters alone give: the governing power unless the estimator stands in."""
        self.power_plan = self.meter_plan
        if estimator is not None and (power_mode == "estimate" or not self.meter_plan.metered):
            why = "forced by [sensors] power" if self.meter_plan.metered else "no power meter"
            self.power_plan = PowerPlan(
                (estimate.NAME,), True, f"estimate from the device tree's Energy Model ({why})"
            )
        governing = [i for i, s in enumerate(temperatures) if s.name in self.governing_names]
        self._temperatures = _LastReadings[TemperatureReading](
            len(temperatures), governing, others_every_s
        )
        # The estimator learns from the meter on every sample: both are read every time.
        fresh = {*self.power_plan.names, *self.meter_plan.names}
        metered = [i for i, s in enumerate(self.powers) if s.name in fresh]
        self._powers = _LastReadings[PowerReading](len(self.powers), metered, others_every_s)

    @classmethod
    def discover(
        cls,
        root: str | Path,
        governing_temperatures: Sequence[str] = (),
        governing_powers: Sequence[str] = (),
        power: PowerOptions = AUTO_POWER,
        *,
        others_every_s: float = 0.0,
    ) -> SensorSet:
        root = Path(root)
        zones = thermal.discover(root)
        zone_types = {s.name.split("#")[0] for s in zones}
        temperatures = zones + hwmon.discover_temperatures(root, zone_types)
        powers: list[PowerSensor] = [
            *ina3221.discover(root),
            *jetson_iio.discover(root),
            *rapl.discover(root),
            *hwmon.discover_powers(root),
        ]
        estimator = None
        if power.mode == "estimate" or (
            power.mode == "auto" and not plan_power(powers, governing_powers).metered
        ):
            estimator, missing = estimate.discover(root, power.static_w, power.coefficients)
            for why in missing:
                log.debug("power estimate: %s", why)
            if estimator is None and power.mode == "estimate":
                log.error('[sensors] power = "estimate", but no domain can be estimated')
        found: list[TemperatureSensor | PowerSensor] = [*temperatures, *powers]
        for sensor in found:
            for attribute in sensor.attributes:
                attribute.open()
        return cls(
            temperatures,
            powers,
            governing_temperatures,
            governing_powers,
            estimator,
            power.mode,
            others_every_s=others_every_s,
        )

    def sample_temperatures(self, now: float | None = None) -> TemperatureSample:
        """Every sensor's reading (those that do not govern as of their last read, see
        `others_every_s`; all of them read afresh when `now` is None)."""
        sensors = self.temperatures
        readings = self._temperatures.refresh(lambda i: sensors[i].sample(), now)
        return TemperatureSample(readings, governing_temperature(readings, self.governing_names))

    def sample_powers(self, now: float) -> PowerSample:
        sensors = self.powers

        def read(index: int) -> PowerReading:
            sensor = sensors[index]
            return PowerReading(sensor.name, sensor.source, sensor.read(now))

        readings = self._powers.refresh(read, now)
        watts = governing_power(readings, self.power_plan)
        if self.estimator is not None and self.meter_plan.metered:
            meter_w = governing_power(readings, self.meter_plan)
            if meter_w is not None:
                self.estimator.learn(meter_w)
        return PowerSample(readings, watts, self.power_plan.estimated)

    @property
    def gone(self) -> bool:
        """True when a sensor file vanished (hotplug, renumbered hwmon): time to re-discover."""
        sensors: list[TemperatureSensor | PowerSensor] = [*self.temperatures, *self.powers]
        return any(attr.gone for sensor in sensors for attr in sensor.attributes)

    @property
    def signature(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Names and files of every sensor: equal signatures mean nothing changed on the board."""
        sensors: list[TemperatureSensor | PowerSensor] = [*self.temperatures, *self.powers]
        return tuple((s.name, tuple(a.path for a in s.attributes)) for s in sensors)
