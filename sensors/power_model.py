"""Power from clocks, voltages and utilization, for boards without a power meter. Pure: numbers
in, watts out; the device tree, /proc/stat and devfreq are read by sensors/estimate.py.

A domain's dynamic power is the kernel Energy Model's P = C · V² · f per busy CPU (C the device
tree's `dynamic-power-coefficient` in µW/MHz/V², V in volts from the OPP table, f in MHz;
docs/power-estimate.md), times how busy it is; a devfreq device (GPU, NPU) counts as one unit.
Everything else the board draws (SoC leakage, DRAM, regulators, I/O) is one static term, learned
from a meter where the board has one (at idle, so that it cannot hide the dynamic model's error)
and configured otherwise (`[sensors] estimate_static_w`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

LEARN_BUSY_MAX = 0.1
"""Learn the static term only while every domain is at most this busy: then the dynamic part the
model could get wrong is a few percent of what the meter reads."""
LEARN_WEIGHT = 0.1
"""Weight of each new idle sample in the learned static term (a 10-sample moving average)."""


@dataclass(frozen=True)
class Opp:
    hz: int
    microvolts: int


@dataclass(frozen=True)
class DomainModel:
    """One frequency domain as the device tree describes it."""

    name: str
    coefficient: float
    """µW/MHz/V² per unit (CPU core, or the whole device)."""
    units: int
    """CPUs in the policy; 1 for a devfreq device."""
    opps: tuple[Opp, ...]
    """Sorted by frequency."""


@dataclass(frozen=True)
class Activity:
    """How one domain ran over the last interval."""

    khz: int
    busy: float
    """Busy units: the sum of each CPU's busy fraction (0..units), or a device's load (0..1)."""


def volts_at(opps: tuple[Opp, ...], khz: int) -> float:
    """The OPP voltage the kernel sets for a frequency: that of the lowest OPP at or above it
    (an OPP's voltage supports every lower frequency), the highest OPP's above the table."""
    frequencies = [opp.hz for opp in opps]
    index = min(bisect.bisect_left(frequencies, khz * 1000), len(opps) - 1)
    return opps[index].microvolts / 1e6


def dynamic_watts(domain: DomainModel, activity: Activity) -> float:
    volts = volts_at(domain.opps, activity.khz)
    busy = min(max(activity.busy, 0.0), float(domain.units))
    return domain.coefficient * volts**2 * (activity.khz / 1000) * busy / 1e6


def estimate_watts(
    domains: tuple[DomainModel, ...], activity: dict[str, Activity], static_w: float
) -> float:
    """Board power: the static term plus every domain's dynamic power; a domain without
    activity this interval counts as idle."""
    return static_w + sum(
        dynamic_watts(domain, activity[domain.name])
        for domain in domains
        if domain.name in activity
    )


def learned_static(
    previous_w: float | None,
    meter_w: float,
    dynamic_w: float,
    busiest: float,
) -> float | None:
    """The static term after one metered sample: moved towards meter − dynamic when the board is
    idle enough (`busiest` is the highest per-unit busy fraction), else unchanged."""
    if busiest > LEARN_BUSY_MAX:
        return previous_w
    residual = max(meter_w - dynamic_w, 0.0)
    if previous_w is None:
        return residual
    return previous_w + LEARN_WEIGHT * (residual - previous_w)
