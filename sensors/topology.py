"""The CPU topology of a board, read once from sysfs: the facts the placement plan
(mcpd/placement/plan.py) is made from.

Each CPU that is online gets its capacity (`cpu_capacity`), its cluster (`cluster_cpus_list`,
else its cpufreq policy's `related_cpus`, else itself), its policy's `cpuinfo_max_freq`, its
core type on an Intel hybrid part (the cpu_core/cpu_atom PMUs), its SMT siblings and its NUMA
node, each from its own adapter (sensors/cpus.py, cpufreq_policies.py, hybrid.py, numa.py);
what a kernel does not say stays unknown. `usable` is where this process may run: on this
machine's own tree its affinity (sched_getaffinity, which a cgroup cpuset or `taskset` narrows),
on a simulated board's every online CPU of that board (the process is pictured on it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sensors import cpufreq_policies, cpus, hybrid, numa
from sensors.hybrid import CoreType


@dataclass(frozen=True)
class Cpu:
    number: int
    capacity: int | None
    """cpu_capacity, 1..1024; None where the kernel has no such file."""
    max_khz: int | None
    """Its cpufreq policy's cpuinfo_max_freq; None without cpufreq."""
    cluster: frozenset[int]
    siblings: frozenset[int]
    """The hardware threads of its core, itself included."""
    core_type: CoreType | None
    node: int | None
    """None on a kernel without NUMA."""

    @property
    def core(self) -> int:
        """Its physical core, named by the core's first thread."""
        return min(self.siblings)


@dataclass(frozen=True)
class CpuTopology:
    cpus: tuple[Cpu, ...]
    """The online CPUs, by number."""
    usable: frozenset[int]

    @classmethod
    def from_sysfs(cls, root: str | Path, usable: Iterable[int] | None = None) -> CpuTopology:
        root = Path(root)
        online = cpus.online(root)
        policies = {cpu: policy for policy in cpufreq_policies.read(root) for cpu in policy.cpus}
        types = hybrid.core_types(root)
        node_of = {cpu: node for node, members in numa.nodes(root).items() for cpu in members}
        found = []
        for number in sorted(online):
            files = cpus.read(root, number)
            policy = policies.get(number)
            cluster = files.cluster or (policy.cpus if policy else None) or frozenset({number})
            found.append(
                Cpu(
                    number,
                    files.capacity,
                    policy.max_khz if policy else None,
                    cluster & online,
                    (files.siblings or frozenset({number})) & online | {number},
                    types.get(number),
                    node_of.get(number),
                )
            )
        if usable is None:
            usable = os.sched_getaffinity(0) if root.resolve() == Path("/") else online
        return cls(tuple(found), frozenset(usable) & online)

    def cpu(self, number: int) -> Cpu:
        return next(cpu for cpu in self.cpus if cpu.number == number)
