"""Fault injection for the simulator: what real boards do to sensor files, on a schedule.

A fault is written `KIND:SENSOR[@START[+DURATION]]`, times in seconds of wall-clock time since the
simulator started (faults test the daemon, which lives in real time); no duration means until the
end. SENSOR is the name mcpd reports (`cpu-thermal`, `VDD_IN`, `coretemp/Package id 0`,
`package-0`), or for `renumber` an hwmon `name` (`ina3221`, `coretemp`).

- vanish:   the value file disappears (ENOENT), as when a device is unbound
- garbage:  the file holds non-numeric text, as a wedged driver or a torn read gives
- sentinel: -256000, Jetson's value for a power-gated zone (temperatures only)
- stuck:    the value stops changing
- renumber: the hwmon device is removed and comes back as the next hwmonN (hotplug); instantaneous
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("vanish", "garbage", "sentinel", "stuck", "renumber")
_SPEC = re.compile(
    r"^(?P<kind>[a-z]+):(?P<sensor>[^@]+)(?:@(?P<start>[\d.]+)(?:\+(?P<duration>[\d.]+))?)?$"
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


def parse(spec: str) -> Fault:
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(f"fault {spec!r}: expected KIND:SENSOR[@START[+DURATION]]")
    kind = match["kind"]
    if kind not in KINDS:
        raise ValueError(
            f"fault {spec!r}: unknown kind {kind!r}; expected one of {', '.join(KINDS)}"
        )
    duration = float(match["duration"]) if match["duration"] else None
    return Fault(kind, match["sensor"], float(match["start"] or 0.0), duration)
