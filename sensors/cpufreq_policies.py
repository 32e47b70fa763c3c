"""What cpufreq says of the CPUs' clusters and peak clocks: each `cpufreq/policyN`'s
`related_cpus` (every CPU whose clock it sets, online or not) and `cpuinfo_max_freq` (the
highest clock the hardware allows, kHz; on intel_pstate the CPU's own turbo maximum, so a P-core
and an E-core differ). docs/cpu-topology.md cites the ABI. A policy whose files cannot be read is
left out; one without a readable maximum keeps its CPUs with the maximum unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sensors import cpulist
from sensors.sysfs import list_dir, read_int, read_line

_MAX_KHZ = 100_000_000
"""100 GHz: a larger cpuinfo_max_freq is garbage, not a clock."""


@dataclass(frozen=True)
class Policy:
    name: str
    cpus: frozenset[int]
    max_khz: int | None


def read(root: Path) -> tuple[Policy, ...]:
    folder = root / "sys/devices/system/cpu/cpufreq"
    policies = []
    for name in list_dir(folder):
        if not name.startswith("policy"):
            continue
        line = read_line(folder / name / "related_cpus")
        cpus = None if line is None else cpulist.parse_words(line)
        if not cpus:
            continue
        max_khz = read_int(folder / name / "cpuinfo_max_freq")
        if max_khz is not None and not 0 < max_khz <= _MAX_KHZ:
            max_khz = None
        policies.append(Policy(name, cpus, max_khz))
    return tuple(policies)
