"""RAPL energy counters through powercap: /sys/class/powercap/intel-rapl:N[:M]/{name,energy_uj}.

RAPL exports energy, not power: W = delta(energy_uj) / delta(t). The counter wraps at
`max_energy_range_uj` (about 262 kJ on Intel, 65.5 kJ on AMD Zen: read it, never hard-code it); at
100 ms sampling it can wrap at most once between samples. `energy_uj` is root-only since Linux 5.10
(CVE-2020-8694), which the tolerant read reports as unavailable. AMD exposes the same files through
`intel_rapl_msr`. `intel-rapl-mmio:N` duplicates the MSR package domain on newer Intel parts and is
skipped so that no power is counted twice (docs/sysfs.md §4-5).
"""

from __future__ import annotations

import re
from pathlib import Path

from sensors.base import POWER_MAX_W, PowerRole
from sensors.sysfs import Attribute, list_dir, read_int, read_line

SOURCE = "powercap:intel-rapl"
_ZONE = re.compile(r"intel-rapl(:\d+)+$")


class RaplZone:
    """Average power over the interval between two reads of a wrapping energy counter."""

    def __init__(
        self, name: str, energy: Attribute, max_range_uj: int | None, role: PowerRole
    ) -> None:
        self.name = name
        self.source = SOURCE
        self.energy = energy
        self.attributes = (energy,)
        self.max_range_uj = max_range_uj
        self.role = role
        self._last: tuple[int, float] | None = None

    def __repr__(self) -> str:
        return f"RaplZone({self.name!r}, role={self.role!r})"

    def read(self, now: float) -> float | None:
        energy = self.energy.read_int()
        if energy is None:
            return None
        last, self._last = self._last, (energy, now)
        if last is None:
            return None  # the first read only starts the interval
        last_energy, last_time = last
        elapsed = now - last_time
        if elapsed <= 0:
            self._last = last
            return None
        delta = energy - last_energy
        if delta < 0:
            if self.max_range_uj is None or energy > self.max_range_uj:
                return None
            delta += self.max_range_uj
        watts = delta / 1e6 / elapsed
        if watts > POWER_MAX_W:
            self.energy.mark_implausible(watts, "W")
            return None
        return watts


def _role(name: str) -> PowerRole:
    """Role of a top-level zone: `psys` is the whole platform, `package-N` a CPU package."""
    if name == "psys":
        return "input"
    return "package" if name.startswith("package-") else "other"


def discover(root: Path) -> list[RaplZone]:
    base = root / "sys/class/powercap"
    entries = [entry for entry in list_dir(base) if _ZONE.match(entry)]
    names = {entry: read_line(base / entry / "name") for entry in entries}
    zones = []
    for entry in sorted(entries, key=lambda e: [int(x) for x in e.split(":")[1:]]):
        own_name = names[entry]
        if own_name is None:
            continue
        parent = entry.rsplit(":", 1)[0]
        role: PowerRole
        if parent in names:  # a subzone (core, uncore, dram) under its package
            name, role = f"{names[parent]}/{own_name}", "subzone"
        else:
            name, role = own_name, _role(own_name)
        max_range = read_int(base / entry / "max_energy_range_uj")
        zones.append(RaplZone(name, Attribute(base / entry / "energy_uj"), max_range, role))
    return zones
