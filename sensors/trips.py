"""Thermal trip points: /sys/class/thermal/thermal_zoneN/trip_point_K_{temp,type}.

The kernel's own thermal governor acts on `passive` trips by lowering the same cpufreq/devfreq
limits mcpd writes (docs/competing-controllers.md); a passive trip at or below mcpd's threshold
means both act at the same moment. Zones are named by `type`, as in sensors/thermal.py; a trip
whose files are unreadable, or a placeholder temperature (thermald-150: -32768000), is skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sensors.sysfs import list_dir, read_int, read_line

_TRIP = re.compile(r"trip_point_(\d+)_type$")


@dataclass(frozen=True)
class Trip:
    zone: str
    index: int
    kind: str
    """passive, active, hot or critical."""
    celsius: float


def discover(root: Path) -> list[Trip]:
    base = root / "sys/class/thermal"
    trips: list[Trip] = []
    for entry in sorted(list_dir(base)):
        if not entry.startswith("thermal_zone"):
            continue
        zone = base / entry
        zone_type = read_line(zone / "type")
        if zone_type is None:
            continue
        for name in sorted(list_dir(zone)):
            match = _TRIP.match(name)
            if match is None:
                continue
            kind = read_line(zone / name)
            millidegrees = read_int(zone / f"trip_point_{match[1]}_temp")
            if kind is None or millidegrees is None or not -40_000 <= millidegrees <= 150_000:
                continue
            trips.append(Trip(zone_type, int(match[1]), kind, millidegrees / 1000))
    return trips


def passive_at_or_below(trips: list[Trip], threshold_c: float) -> list[Trip]:
    """The kernel's passive trips that act no later than mcpd would."""
    return [t for t in trips if t.kind == "passive" and t.celsius <= threshold_c]
