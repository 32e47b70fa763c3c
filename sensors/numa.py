"""NUMA nodes: `/sys/devices/system/node/nodeN/cpulist`, the CPUs local to each node's memory
(Documentation/ABI/stable/sysfs-devices-node, docs/cpu-topology.md). A kernel built without
CONFIG_NUMA has no `node` folder: one node, unnamed. A node with memory and no CPU (CXL, HBM)
prints an empty list and is left out.
"""

from __future__ import annotations

from pathlib import Path

from sensors import cpulist
from sensors.sysfs import list_dir, read_line


def nodes(root: Path) -> dict[int, frozenset[int]]:
    """Node number -> its CPUs, for the nodes that have CPUs."""
    folder = root / "sys/devices/system/node"
    found = {}
    for name in list_dir(folder):
        if not (name.startswith("node") and name[4:].isdigit()):
            continue
        line = read_line(folder / name / "cpulist")
        cpus = None if line is None else cpulist.parse(line)
        if cpus:
            found[int(name[4:])] = cpus
    return found
