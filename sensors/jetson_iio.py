"""Jetson JetPack 4 power rails through NVIDIA's `ina3221x` IIO driver.

`/sys/bus/i2c/drivers/ina3221x/<bus>-00xx/iio:deviceN/`: `rail_name_K` names rail K and
`in_powerK_input` gives its power in mW (`in_currentK_input` mA, `in_voltageK_input` mV beside it).
Nano: `POM_5V_IN`, `POM_5V_GPU`, `POM_5V_CPU`; Xavier NX: `VDD_IN`, `VDD_CPU_GPU_CV`, `VDD_SOC`
(docs/sysfs.md §2). JetPack 5 replaced this driver with the mainline hwmon one (ina3221.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from sensors.base import INPUT_RAILS, AttributePower, PowerRole
from sensors.sysfs import Attribute, list_dir, read_line

SOURCE = "iio:ina3221x"
_RAIL_NAME = re.compile(r"rail_name_(\d+)$")


def discover(root: Path) -> list[AttributePower]:
    driver = root / "sys/bus/i2c/drivers/ina3221x"
    rails = []
    for client in list_dir(driver):
        for iio in list_dir(driver / client):
            if not iio.startswith("iio:device"):
                continue
            directory = driver / client / iio
            for entry in list_dir(directory):
                match = _RAIL_NAME.match(entry)
                if not match:
                    continue
                name = read_line(directory / entry)
                if name is None:
                    continue
                role: PowerRole = "input" if name in INPUT_RAILS else "rail"
                power = Attribute(directory / f"in_power{match.group(1)}_input")
                rails.append(AttributePower(name, SOURCE, power, 1e-3, role))
    return rails
