"""Thermal zones: /sys/class/thermal/thermal_zoneN/{type,temp,mode}.

Zones are found by their `type`, never by index: zone numbers change across kernels and boots
(docs/sysfs.md §6.5). A zone whose `mode` is `disabled` may answer EINVAL on `temp`; the
tolerant read turns that into "unavailable", so `mode` itself needs no reading.
"""

from __future__ import annotations

import re
from pathlib import Path

from sensors.base import TemperatureSensor
from sensors.sysfs import Attribute, list_dir, read_line

SOURCE = "thermal"
_ZONE_DIR = re.compile(r"thermal_zone\d+$")

# Zone-type prefixes of on-die SoC/CPU sensors (matched case-insensitively): Jetson JP6 `cpu-thermal`,
# `gpu-thermal`, `cv0-thermal`, `soc0-thermal`, `tj-thermal`; JP4/JP5 `CPU-therm`, `AO-therm`,
# `PLL-therm`, `AUX-therm`, `Tdiode_tegra`, JP5 Orin upper-case `CPU`/`CV0`/`SOC0`/`tj`; TX2
# `BCPU-therm`/`MCPU-therm`; RK3588 BSP `soc-thermal`, `bigcore0-thermal`, `littlecore-thermal`,
# `center-thermal`, `npu-thermal`, mainline `package-thermal` (docs/sysfs.md §1-3).
_SOC_PREFIXES = (
    "cpu",
    "bcpu",
    "mcpu",
    "gpu",
    "cv",
    "soc",
    "tj",
    "ao-",
    "ao_",
    "aux",
    "pll",
    "tdiode",
    "bigcore",
    "littlecore",
    "center",
    "npu",
    "package-thermal",
)
# Never governing although they look like SoC sensors: Jetson `PMIC-Die` reads a constant 100000
# (jtop skips it too), `thermal-fan-est` is an estimate computed from the others.
_NOT_SOC = ("pmic", "thermal-fan-est")


def is_soc_zone(zone_type: str) -> bool:
    lowered = zone_type.lower()
    if lowered.startswith(_NOT_SOC):
        return False
    return lowered.startswith(_SOC_PREFIXES)


def discover(root: Path) -> list[TemperatureSensor]:
    base = root / "sys/class/thermal"
    sensors: list[TemperatureSensor] = []
    seen: dict[str, int] = {}
    for entry in sorted(list_dir(base), key=_zone_number):
        if not _ZONE_DIR.match(entry):
            continue
        zone = base / entry
        zone_type = read_line(zone / "type")
        if zone_type is None:
            continue
        # Two zones may share a type (several `acpitz` on x86); keep both, distinguishable.
        count = seen.get(zone_type, 0)
        seen[zone_type] = count + 1
        name = zone_type if count == 0 else f"{zone_type}#{count}"
        sensors.append(
            TemperatureSensor(
                name, SOURCE, Attribute(zone / "temp"), governs=is_soc_zone(zone_type)
            )
        )
    return sensors


def _zone_number(entry: str) -> tuple[int, str]:
    digits = entry.removeprefix("thermal_zone")
    return (int(digits), entry) if digits.isdigit() else (1 << 30, entry)
