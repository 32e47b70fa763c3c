"""Fault injection for the simulator: what real boards do to sensor files and to their cooling, on a
schedule.

A sensor fault is written `KIND:SENSOR[@START[+DURATION]]`, times in seconds of wall-clock time
since the simulator started (faults test the daemon, which lives in real time); no duration means
until the end. SENSOR is the name mcpd reports (`cpu-thermal`, `VDD_IN`, `coretemp/Package id 0`,
`package-0`), or for `renumber` an hwmon `name` (`ina3221`, `coretemp`).

- vanish:   the value file disappears (ENOENT), as when a device is unbound
- garbage:  the file holds non-numeric text, as a wedged driver or a torn read gives
- sentinel: -256000, Jetson's value for a power-gated zone (temperatures only)
- stuck:    the value stops changing
- renumber: the hwmon device is removed and comes back as the next hwmonN (hotplug); instantaneous

A cooling fault changes the plant itself, `KIND:AMOUNT[@START[+DURATION]]`, times in seconds of
simulated time (the physics' clock, as the load schedule's): it takes effect from START, in full at
once, or growing linearly over DURATION, and stays.

- fan-stop: the thermal resistance to ambient multiplied by AMOUNT (> 1), at once (a fan that
            stops: R rises in a step; docs/cooling-health.md)
- dust:     the thermal resistance multiplied by AMOUNT (> 1) by the end of DURATION (dust in the
            fins, dried thermal paste: R rises slowly, over hours)
- ambient:  the air warmer by AMOUNT °C (negative: cooler), at once or over DURATION
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

KINDS = ("vanish", "garbage", "sentinel", "stuck", "renumber")
COOLING_KINDS = ("fan-stop", "dust", "ambient")
_SPEC = re.compile(
    r"^(?P<kind>[a-z-]+):(?P<sensor>[^@]+)(?:@(?P<start>[\d.]+)(?:\+(?P<duration>[\d.]+))?)?$"
)


@dataclass(frozen=True)
class Fault:
    kind: str
    sensor: str
    start_s: float = 0.0
    duration_s: float | None = None

    def active(self, elapsed_s: float) -> bool:
        if elapsed_s < self.start_s:
            return False
        return self.duration_s is None or elapsed_s < self.start_s + self.duration_s


@dataclass(frozen=True)
class CoolingFault:
    kind: str
    """One of COOLING_KINDS."""
    amount: float
    """fan-stop and dust: the factor on the thermal resistance; ambient: °C added to the air."""
    start_s: float = 0.0
    duration_s: float = 0.0
    """0: in full at START; else the change grows linearly over this many seconds."""

    def progress(self, sim_s: float) -> float:
        """How much of the change is in force at `sim_s` of simulated time, 0 to 1."""
        if sim_s < self.start_s:
            return 0.0
        if self.duration_s <= 0.0:
            return 1.0
        return min((sim_s - self.start_s) / self.duration_s, 1.0)


def resistance_factor(faults: Iterable[CoolingFault], sim_s: float) -> float:
    """What the faults in force at `sim_s` multiply the thermal resistance by."""
    factor = 1.0
    for fault in faults:
        if fault.kind in ("fan-stop", "dust"):
            factor *= 1.0 + (fault.amount - 1.0) * fault.progress(sim_s)
    return factor


def ambient_shift(faults: Iterable[CoolingFault], sim_s: float) -> float:
    """°C the faults in force at `sim_s` add to the air."""
    return sum(f.amount * f.progress(sim_s) for f in faults if f.kind == "ambient")


def parse(spec: str) -> Fault | CoolingFault:
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(
            f"fault {spec!r}: expected KIND:SENSOR[@START[+DURATION]] or "
            "KIND:AMOUNT[@START[+DURATION]]"
        )
    kind = match["kind"]
    start = float(match["start"] or 0.0)
    if kind in COOLING_KINDS:
        return _cooling(spec, kind, match["sensor"], start, match["duration"])
    if kind not in KINDS:
        raise ValueError(
            f"fault {spec!r}: unknown kind {kind!r}; expected one of "
            f"{', '.join(KINDS + COOLING_KINDS)}"
        )
    duration = float(match["duration"]) if match["duration"] else None
    return Fault(kind, match["sensor"], start, duration)


def _cooling(spec: str, kind: str, amount: str, start: float, duration: str | None) -> CoolingFault:
    try:
        value = float(amount)
    except ValueError:
        raise ValueError(f"fault {spec!r}: {amount!r} is not a number") from None
    if kind == "ambient" and not -40.0 <= value <= 40.0:
        raise ValueError(f"fault {spec!r}: expected an ambient change of -40 to 40 °C")
    if kind != "ambient" and not 1.0 < value <= 10.0:
        raise ValueError(f"fault {spec!r}: expected a factor on the resistance above 1, up to 10")
    if kind == "dust" and not duration:
        raise ValueError(f"fault {spec!r}: dust needs +DURATION, the seconds it builds up over")
    return CoolingFault(kind, value, start, float(duration) if duration else 0.0)
