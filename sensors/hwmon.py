"""hwmon devices: /sys/class/hwmon/hwmonN/{name, tempN_input, tempN_label, powerN_input}.

Devices are found by `name` (and channels by `label`), never by the hwmonN index, which changes
across boots and on hotplug (Jetson's INA3221 has been seen as hwmon1, hwmon2 and hwmon3).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sensors.base import INPUT_RAILS, AttributePower, PowerRole, TemperatureSensor
from sensors.sysfs import Attribute, device_name, list_dir, read_line
from sensors.thermal import is_soc_zone

_TEMP_INPUT = re.compile(r"temp(\d+)_input$")
_POWER_INPUT = re.compile(r"power(\d+)_(input|average)$")

# Devices with their own adapter (ina3221.py).
_OWN_ADAPTER = frozenset({"ina3221"})


@dataclass(frozen=True)
class HwmonDevice:
    name: str
    path: Path
    label: str
    """`name`, or `name` + device (`coretemp.1`) when several devices share a name."""


def devices(root: Path) -> list[HwmonDevice]:
    base = root / "sys/class/hwmon"
    found = []
    for entry in list_dir(base):
        name = read_line(base / entry / "name")
        if name is not None:
            found.append((name, base / entry))
    counts = Counter(name for name, _ in found)
    result = [
        HwmonDevice(name, path, name if counts[name] == 1 else f"{name}.{device_name(path)}")
        for name, path in found
    ]
    return sorted(result, key=lambda device: device.label)


def _channels(device: HwmonDevice, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    channels = []
    for entry in list_dir(device.path):
        match = pattern.match(entry)
        if match:
            channels.append((int(match.group(1)), entry))
    return sorted(channels)


def is_zone_mirror(hwmon_name: str, zone_types: set[str]) -> bool:
    """The thermal core exports each zone again as an hwmon named after its type with `-` -> `_`,
    and a 2026 patch appends `_<zone id>` (docs/sysfs.md §0)."""
    mirrors = {zone_type.replace("-", "_") for zone_type in zone_types}
    return hwmon_name in mirrors or re.sub(r"_\d+$", "", hwmon_name) in mirrors


def _governs(device: HwmonDevice, label: str | None, labels: set[str]) -> bool:
    if device.name == "coretemp":
        return True  # "Package id N" and "Core N" (older kernels: "Physical id N")
    if device.name == "k10temp":
        # Tctl is a control value, offset by up to +27 °C on some Ryzen/Threadripper parts; use the
        # real die temperature where the CPU reports one (docs/sysfs.md §5).
        return label == "Tdie" or (label == "Tctl" and "Tdie" not in labels)
    # A zone mirror whose zone is not exported as a thermal zone stands in for it.
    return is_soc_zone(re.sub(r"_\d+$", "", device.name).replace("_", "-"))


def discover_temperatures(root: Path, zone_types: set[str]) -> list[TemperatureSensor]:
    sensors = []
    for device in devices(root):
        if device.name in _OWN_ADAPTER or is_zone_mirror(device.name, zone_types):
            continue
        channels = _channels(device, _TEMP_INPUT)
        labels = {n: read_line(device.path / f"temp{n}_label") for n, _ in channels}
        present = {label for label in labels.values() if label}
        for number, entry in channels:
            label = labels[number]
            name = f"{device.label}/{label or f'temp{number}'}"
            attr = Attribute(device.path / entry)
            governs = _governs(device, label, present)
            sensors.append(TemperatureSensor(name, f"hwmon:{device.name}", attr, governs=governs))
    return sensors


def discover_powers(root: Path) -> list[AttributePower]:
    """`powerN_input` (or `powerN_average`) channels, in microwatts."""
    sensors = []
    for device in devices(root):
        if device.name in _OWN_ADAPTER:
            continue
        # A channel may offer both powerN_input and powerN_average: read the instantaneous one.
        chosen: dict[int, str] = {}
        for number, entry in _channels(device, _POWER_INPUT):
            if number not in chosen or entry.endswith("_input"):
                chosen[number] = entry
        for number, entry in sorted(chosen.items()):
            label = read_line(device.path / f"power{number}_label")
            name = label if label in INPUT_RAILS else f"{device.label}/{label or f'power{number}'}"
            role: PowerRole = "input" if label in INPUT_RAILS else "other"
            attr = Attribute(device.path / entry)
            sensors.append(AttributePower(name, f"hwmon:{device.name}", attr, 1e-6, role))
    return sensors
