"""A simulated board's CPU topology as its kernel shows it (docs/cpu-topology.md): the online
list, `cpuN/cpu_capacity`, `cpuN/topology/*`, NUMA nodes and, on an Intel hybrid part, the
cpu_core/cpu_atom PMUs. The reader is sensors/topology.py.

Each profile says what its kernel prints: an arm64 kernel always has cpu_capacity (1024 for every
CPU unless each device-tree CPU node has a capacity-dmips-mhz); the x86 kernels simulated here
predate it there; cluster_cpus_list came in Linux 5.16 and core_cpus_list in 5.3, so the older
BSP kernels have neither and the reader falls back to cpufreq's related_cpus and
thread_siblings_list. `host` stands this machine's own topology in for a profile's, so that a
plan made on a simulated board names CPUs this process may run on: the CPUs outside its affinity
(a cpuset, taskset, a CI runner's container) are left out, as a real board's plan leaves them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sensors.cpulist import format_list
from sensors.cpus import CAPACITY_SCALE
from sensors.topology import CpuTopology

if TYPE_CHECKING:
    from mcpd.sim.tree import BoardTree

Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Topology:
    cpus: tuple[int, ...]
    """The online CPUs."""
    capacities: tuple[int, ...] = ()
    """cpu_capacity of each CPU in `cpus` order; () where the kernel prints no such file."""
    clusters: Groups = ()
    """cluster_cpus_list groups; () where the kernel predates it."""
    cores: Groups = ()
    """SMT sibling groups; a CPU in none is a core of one thread."""
    nodes: Groups = ()
    """NUMA nodes' CPUs; () for node0 with every CPU."""
    hybrid: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    """(cpu_core's CPUs, cpu_atom's CPUs) on an Intel hybrid part."""
    core_cpus_list: bool = True
    """False on kernels before 5.3, which name siblings thread_siblings_list alone."""


def dmips_capacities(dmips_mhz: Sequence[int], max_khz: Sequence[int]) -> tuple[int, ...]:
    """cpu_capacity as arm64 kernels compute it from each CPU node's capacity-dmips-mhz and its
    cpufreq maximum (drivers/base/arch_topology.c, topology_normalize_cpu_scale): dmips x f_max,
    scaled so that the largest is 1024, rounded down."""
    raw = [dmips * khz for dmips, khz in zip(dmips_mhz, max_khz, strict=True)]
    return tuple(value * CAPACITY_SCALE // max(raw) for value in raw)


def uniform(cpus: Iterable[int], capacity: bool) -> Topology:
    """A topology with nothing to tell its CPUs apart by (cpu_capacity 1024 on arm64)."""
    ordered = tuple(sorted(cpus))
    return Topology(ordered, (CAPACITY_SCALE,) * len(ordered) if capacity else ())


def host() -> Topology:
    """This machine's topology, as its own sysfs shows it, narrowed to the CPUs this process may
    run on."""
    whole = CpuTopology.from_sysfs("/")
    found = dataclasses.replace(
        whole,
        cpus=tuple(
            dataclasses.replace(
                cpu,
                cluster=cpu.cluster & whole.usable,
                siblings=cpu.siblings & whole.usable,
            )
            for cpu in whole.cpus
            if cpu.number in whole.usable
        ),
    )
    capacities = tuple(cpu.capacity for cpu in found.cpus)
    nodes: dict[int, list[int]] = {}
    for cpu in found.cpus:
        nodes.setdefault(cpu.node or 0, []).append(cpu.number)
    return Topology(
        tuple(cpu.number for cpu in found.cpus),
        () if None in capacities else tuple(c for c in capacities if c is not None),
        _groups(cpu.cluster for cpu in found.cpus),
        _groups(cpu.siblings for cpu in found.cpus),
        tuple(tuple(members) for _, members in sorted(nodes.items())),
    )


def _groups(sets: Iterable[frozenset[int]]) -> Groups:
    return tuple(sorted({tuple(sorted(members)) for members in sets}))


def _group_of(groups: Groups, cpu: int) -> tuple[int, ...]:
    return next((group for group in groups if cpu in group), (cpu,))


def write(tree: BoardTree, topology: Topology) -> None:
    base = "sys/devices/system/cpu"
    listed = f"{format_list(topology.cpus)}\n"
    for name in ("online", "possible", "present"):
        tree.write(f"{base}/{name}", listed)
    nodes = topology.nodes or (topology.cpus,)
    for index, cpu in enumerate(topology.cpus):
        folder = f"{base}/cpu{cpu}"
        if topology.capacities:
            tree.write(f"{folder}/cpu_capacity", f"{topology.capacities[index]}\n")
        siblings = f"{format_list(_group_of(topology.cores, cpu))}\n"
        tree.write(f"{folder}/topology/thread_siblings_list", siblings)
        if topology.core_cpus_list:
            tree.write(f"{folder}/topology/core_cpus_list", siblings)
        if topology.clusters:
            cluster = _group_of(topology.clusters, cpu)
            tree.write(f"{folder}/topology/cluster_cpus_list", f"{format_list(cluster)}\n")
    tree.write("sys/devices/system/node/online", f"{format_list(range(len(nodes)))}\n")
    for number, members in enumerate(nodes):
        tree.write(f"sys/devices/system/node/node{number}/cpulist", f"{format_list(members)}\n")
    if topology.hybrid is not None:
        for kind, members in zip(("core", "atom"), topology.hybrid, strict=True):
            tree.write(f"sys/devices/cpu_{kind}/cpus", f"{format_list(members)}\n")
