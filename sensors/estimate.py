"""Board power estimated from the Energy Model, for boards without a power meter (RK3588).

A power sensor like the meters (sensors.base.PowerSensor), named `estimate`, whose value is
sensors.power_model's formula over what this module reads: each cpufreq policy's current
frequency and its CPUs' utilization (/proc/stat, sensors.cpustat), each devfreq device's `load`
(sensors.devfreq_load), and the device-tree facts found once at discovery (sensors.devicetree).
CPU utilization is measured over at least `WINDOW_S` (/proc/stat counts in 10 ms jiffies, so a
100 ms interval would quantize it to a tenth); clocks and device loads are read at every sample,
so a cap the governor writes shows in the next estimate. A device whose load cannot be read counts as
fully busy at its top frequency: an estimate that errs high makes the governor throttle early,
never late.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from sensors import cpustat, devfreq_load, devicetree
from sensors.base import PowerRole
from sensors.power_model import (
    Activity,
    DomainModel,
    dynamic_watts,
    estimate_watts,
    learned_static,
)
from sensors.sysfs import Attribute, list_dir, parse_int, read_line

log = logging.getLogger("mcpd.sensors")

NAME = "estimate"
SOURCE = "estimate:energy-model"
WINDOW_S = 0.5
_WARNED: set[str] = set()
"""Configured coefficients already reported as naming no domain."""


class EstimatedPower:
    """Watts from clocks, voltages and utilization; see the module's docstring."""

    role: PowerRole = "input"

    def __init__(
        self,
        root: Path,
        models: tuple[DomainModel, ...],
        cpus: Mapping[str, tuple[int, ...]],
        static_w: float,
    ) -> None:
        self.name = NAME
        self.source = SOURCE
        self.root = root
        self.models = models
        self.cpus = dict(cpus)
        """cpufreq domain -> its CPUs; the other models are devfreq devices."""
        self.static_w = static_w
        self.learned = False
        self._cur = {
            name: Attribute(root / f"sys/devices/system/cpu/cpufreq/{name}/scaling_cur_freq")
            for name in self.cpus
        }
        self.attributes = tuple(self._cur.values())
        self._stat = cpustat.CpuStat(root)
        self._window_start: float | None = None
        self._busy: dict[str, float] | None = None
        self._activity: dict[str, Activity] | None = None
        self._provisional = True

    def __repr__(self) -> str:
        return f"EstimatedPower({[m.name for m in self.models]}, static_w={self.static_w:.2f})"

    def _measure_busy(self) -> dict[str, float]:
        """Busy CPUs per policy since the previous call. Before a first /proc/stat interval (or
        without the file) every CPU counts as busy: the estimate errs high until it knows
        better."""
        busy = self._stat.busy()
        self._provisional = busy is None
        return {
            name: len(cpus) if busy is None else sum(busy.get(cpu, 0.0) for cpu in cpus)
            for name, cpus in self.cpus.items()
        }

    def _activity_now(self, busy: dict[str, float]) -> dict[str, Activity]:
        """Each domain's frequency as it is now (a cap just written counts at once), CPUs with
        the last window's utilization, devices with their own load."""
        activity = {}
        for model in self.models:
            top_khz = model.opps[-1].hz // 1000
            if model.name in self.cpus:
                khz = self._cur[model.name].read_int(0)
                activity[model.name] = Activity(top_khz if khz is None else khz, busy[model.name])
            else:
                load = devfreq_load.read(self.root, model.name)
                activity[model.name] = (
                    Activity(top_khz, 1.0) if load is None else Activity(load.khz, load.busy)
                )
        return activity

    def read(self, now: float) -> float | None:
        """The estimate at `now`: utilization over the last window (`WINDOW_S`), clocks now."""
        if (
            self._busy is None
            or self._provisional
            or self._window_start is None
            or now - self._window_start >= WINDOW_S
        ):
            self._busy = self._measure_busy()
            self._window_start = now
        self._activity = self._activity_now(self._busy)
        return estimate_watts(self.models, self._activity, self.static_w)

    def full_load_w(self, caps_mhz: Mapping[str, float]) -> float:
        """The estimate with every domain fully busy at its cap (at its top frequency where it
        has none): what a level would draw under any load, before the governor moves to it."""
        activity = {
            model.name: Activity(
                round(caps_mhz.get(model.name, model.opps[-1].hz / 1e6) * 1000), model.units
            )
            for model in self.models
        }
        return estimate_watts(self.models, activity, self.static_w)

    def learn(self, meter_w: float) -> None:
        """Fit the static term to a meter's reading of the same moment (at idle only)."""
        if self._activity is None or self._provisional:
            return
        dynamic = sum(dynamic_watts(m, self._activity[m.name]) for m in self.models)
        busiest = max((self._activity[m.name].busy / m.units for m in self.models), default=0.0)
        static = learned_static(self.static_w if self.learned else None, meter_w, dynamic, busiest)
        if static is not None:
            self.static_w, self.learned = static, True


def _cpus(policy: Path) -> tuple[int, ...]:
    text = read_line(policy / "related_cpus") or ""
    return tuple(int(cpu) for cpu in text.split() if parse_int(cpu) is not None)


def discover(
    root: Path, static_w: float, coefficients: Mapping[str, float]
) -> tuple[EstimatedPower | None, tuple[str, ...]]:
    """The estimator for this board, or None when no domain has Energy Model facts; with the
    reasons each domain left out has none."""
    models: list[DomainModel] = []
    cpus: dict[str, tuple[int, ...]] = {}
    missing: list[str] = []
    policies = root / "sys/devices/system/cpu/cpufreq"
    for entry in list_dir(policies):
        if not entry.startswith("policy") or not entry[6:].isdigit():
            continue
        related = _cpus(policies / entry)
        if not related:
            continue
        node = devicetree.cpu_node(root, related[0])
        found = devicetree.energy_model(root, entry, node, len(related), coefficients.get(entry))
        if isinstance(found, str):
            missing.append(found)
            continue
        models.append(found)
        cpus[entry] = related
    devices = list_dir(root / "sys/class/devfreq")
    for entry in devices:
        node = devicetree.devfreq_node(root, entry)
        found = devicetree.energy_model(root, entry, node, 1, coefficients.get(entry))
        if isinstance(found, str):
            missing.append(found)
        else:
            models.append(found)
    known = {entry for entry in list_dir(policies) if entry.startswith("policy")} | set(devices)
    for name in sorted(set(coefficients) - known - _WARNED):
        _WARNED.add(name)  # once per name: discovery runs again on every rescan
        log.warning("[sensors] power_coefficients: no domain %r on this board", name)
    if not models:
        return None, tuple(missing)
    return EstimatedPower(root, tuple(models), cpus, static_w), tuple(missing)
