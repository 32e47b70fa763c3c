"""The Energy Model facts of a frequency domain, from the flattened device tree under /proc.

A CPU's node is `/sys/devices/system/cpu/cpuN/of_node`, a devfreq device's is its device's
`of_node` (both links into /sys/firmware/devicetree/base, which /proc/device-tree shows too). The
node's `dynamic-power-coefficient` is one big-endian 32-bit cell (µW/MHz/V²); its
`operating-points-v2` cell is the phandle of its OPP table, found among the node's own children
(GPU tables on RK3588) or the tree's top level (CPU cluster tables); each `opp-*` child holds
`opp-hz` (one 64-bit value in two cells) and `opp-microvolt` (target, or target/min/max: the
first cell is the target). docs/power-estimate.md cites the bindings. Anything missing or
malformed makes the domain unestimated, with the reason, never an exception.
"""

from __future__ import annotations

import os
from pathlib import Path

from safefs import open_regular
from sensors.power_model import DomainModel, Opp
from sensors.sysfs import list_dir

_MAX_PROPERTY = 4096


def read_cells(path: Path) -> tuple[int, ...] | None:
    """A property as big-endian 32-bit cells; None when missing, unreadable or not whole cells."""
    try:
        fd = open_regular(path)
    except OSError:
        return None
    try:
        data = os.read(fd, _MAX_PROPERTY + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not data or len(data) % 4 or len(data) > _MAX_PROPERTY:
        return None
    return tuple(int.from_bytes(data[i : i + 4], "big") for i in range(0, len(data), 4))


def cpu_node(root: Path, cpu: int) -> Path:
    return root / f"sys/devices/system/cpu/cpu{cpu}/of_node"


def devfreq_node(root: Path, name: str) -> Path:
    return root / "sys/class/devfreq" / name / "device/of_node"


def _opp_table(root: Path, node: Path, phandle: int) -> Path | None:
    base = root / "proc/device-tree"
    for parent in (node, base):
        for child in list_dir(parent):
            candidate = parent / child
            if candidate.is_dir() and read_cells(candidate / "phandle") == (phandle,):
                return candidate
    return None


def _opps(table: Path) -> tuple[Opp, ...]:
    opps = []
    for child in list_dir(table):
        if not child.startswith("opp"):
            continue
        hz = read_cells(table / child / "opp-hz")
        microvolts = read_cells(table / child / "opp-microvolt")
        if hz is None or len(hz) != 2 or not microvolts or len(microvolts) not in (1, 3):
            continue
        opps.append(Opp((hz[0] << 32) | hz[1], microvolts[0]))
    return tuple(sorted(opps, key=lambda opp: opp.hz))


def energy_model(
    root: Path, name: str, node: Path, units: int, configured: float | None = None
) -> DomainModel | str:
    """The domain's model, or why there is none. A `configured` coefficient (`[sensors]
    power_coefficients`) stands in for the device tree's, which some nodes lack (RK3588's NPU)."""
    cells = read_cells(node / "dynamic-power-coefficient")
    coefficient = configured or (cells[0] if cells and len(cells) == 1 else 0)
    if not coefficient:
        return f"{name}: no dynamic-power-coefficient in the device tree"
    phandle = read_cells(node / "operating-points-v2")
    table = _opp_table(root, node, phandle[0]) if phandle and len(phandle) == 1 else None
    opps = _opps(table) if table is not None else ()
    if not opps:
        return f"{name}: no OPP table with voltages in the device tree"
    return DomainModel(name, float(coefficient), units, opps)
