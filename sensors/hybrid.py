"""Intel's hybrid CPUs (Alder Lake and later): the kernel registers one perf PMU per core type,
`/sys/devices/cpu_core` for the P-cores and `/sys/devices/cpu_atom` for the E-cores, each with a
`cpus` list (tools/perf/Documentation/intel-hybrid.txt, docs/cpu-topology.md). A CPU that is
not hybrid has the one PMU `/sys/devices/cpu` and neither folder: then nothing is known here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from sensors import cpulist
from sensors.sysfs import read_line

CoreType = Literal["core", "atom"]
"""The PMU's own names: "core" the P-cores, "atom" the E-cores."""


def core_types(root: Path) -> dict[int, CoreType]:
    """CPU -> its core type; empty unless both lists read (one without the other is no
    hybrid split to place by)."""
    found: dict[int, CoreType] = {}
    for kind in ("core", "atom"):
        line = read_line(root / f"sys/devices/cpu_{kind}/cpus")
        cpus = None if line is None else cpulist.parse(line)
        if not cpus:
            return {}
        found.update(dict.fromkeys(cpus, kind))
    return found
