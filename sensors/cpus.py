"""The logical CPUs under /sys/devices/system/cpu: which are online, and each one's capacity,
cluster and SMT siblings (docs/cpu-topology.md cites the ABI of each file).

`online` is the kernel's cpu_online_mask. `cpuN/cpu_capacity` (arm64 and the other arch_topology
users; x86 kernels lately) is the CPU's compute capacity normalized to 1024 for the fastest;
`cpuN/topology/cluster_cpus_list` (Linux 5.16+) the CPUs sharing its cluster (an arm64 cpu-map
cluster, an x86 L2 module); `core_cpus_list` (Linux 5.3+; `thread_siblings_list` before) the
hardware threads of its core. Any of them may be missing (an older kernel, an architecture
without it) or unreadable: that fact is then unknown (None) and the caller falls back, never an
error. Read once, at start: CPU hotplug is not followed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sensors import cpulist
from sensors.sysfs import list_dir, read_int, read_line

CAPACITY_SCALE = 1024
"""SCHED_CAPACITY_SCALE: the capacity of the fastest CPU."""


@dataclass(frozen=True)
class CpuFiles:
    """What one CPU's own files say; None where a file is missing or unreadable."""

    number: int
    capacity: int | None
    cluster: frozenset[int] | None
    siblings: frozenset[int] | None


def cpu_dir(root: Path) -> Path:
    return root / "sys/devices/system/cpu"


def online(root: Path) -> frozenset[int]:
    """The online CPUs: the `online` list, else every cpuN folder (a tree without the list)."""
    line = read_line(cpu_dir(root) / "online")
    listed = None if line is None else cpulist.parse(line)
    if listed:
        return listed
    names = list_dir(cpu_dir(root))
    return frozenset(int(name[3:]) for name in names if name[:3] == "cpu" and name[3:].isdigit())


def _cpus(path: Path) -> frozenset[int] | None:
    line = read_line(path)
    cpus = None if line is None else cpulist.parse(line)
    return cpus or None  # a CPU's own group always holds the CPU: empty is not an answer


def read(root: Path, number: int) -> CpuFiles:
    folder = cpu_dir(root) / f"cpu{number}"
    capacity = read_int(folder / "cpu_capacity")
    if capacity is not None and not 0 < capacity <= CAPACITY_SCALE:
        capacity = None
    siblings = _cpus(folder / "topology/core_cpus_list")
    if siblings is None:
        siblings = _cpus(folder / "topology/thread_siblings_list")
    return CpuFiles(number, capacity, _cpus(folder / "topology/cluster_cpus_list"), siblings)
