"""INA3221 power monitors through the mainline hwmon driver (Jetson JetPack 5/6).

`/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmonN/`: channels 1-3 with `inN_label` (rail name),
`inN_input` (bus voltage, mV) and `currN_input` (mA). The driver exports no power attribute, so
W = mV x mA / 1e6 (Documentation/hwmon/ina3221.rst). `in4..6` are shunt voltages and `in7`/`curr4`
sums; they are not rails. A disabled channel answers ENODATA; NVIDIA labels unused channels `NC`
and mainline leaves them unlabelled and disabled (docs/sysfs.md §1).
"""

from __future__ import annotations

from pathlib import Path

from sensors.base import INPUT_RAILS, PowerRole
from sensors.hwmon import devices
from sensors.sysfs import Attribute, device_name, read_line

SOURCE = "hwmon:ina3221"
_CHANNELS = (1, 2, 3)
# The INA3221 measures bus voltages up to 26 V; no Jetson rail carries 100 A.
_MAX_MILLIVOLTS = 26_000
_MAX_MILLIAMPS = 100_000


class Ina3221Rail:
    def __init__(self, name: str, voltage: Attribute, current: Attribute, role: PowerRole) -> None:
        self.name = name
        self.source = SOURCE
        self.voltage = voltage
        self.current = current
        self.attributes = (voltage, current)
        self.role = role

    def __repr__(self) -> str:
        return f"Ina3221Rail({self.name!r}, role={self.role!r})"

    def read(self, now: float) -> float | None:
        millivolts = self.voltage.read_int(0, _MAX_MILLIVOLTS)
        milliamps = self.current.read_int(0, _MAX_MILLIAMPS)
        if millivolts is None or milliamps is None:
            return None
        return millivolts * milliamps / 1e6


def discover(root: Path) -> list[Ina3221Rail]:
    rails = []
    for device in devices(root):
        if device.name != "ina3221":
            continue
        for channel in _CHANNELS:
            if not (device.path / f"curr{channel}_input").exists():
                continue
            label = read_line(device.path / f"in{channel}_label")
            if label == "NC":
                continue
            if label is None:
                if read_line(device.path / f"in{channel}_enable") == "0":
                    continue
                label = f"ina3221.{device_name(device.path)}/ch{channel}"
            role: PowerRole = "input" if label in INPUT_RAILS else "rail"
            rails.append(
                Ina3221Rail(
                    label,
                    Attribute(device.path / f"in{channel}_input"),
                    Attribute(device.path / f"curr{channel}_input"),
                    role,
                )
            )
    return rails
