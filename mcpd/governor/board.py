"""Which board this is, from the device tree, the L4T release file and the CPU vendor.

`/proc/device-tree/compatible` is NUL-separated, most specific first and the SoC last; the model
string differs between kernels, so it is reported but never matched (docs/sysfs.md §0, §3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sensors.sysfs import try_read_text

# SoC compatible string -> platform name.
_SOCS = {
    "nvidia,tegra234": "jetson-orin",
    "nvidia,tegra194": "jetson-xavier",
    "nvidia,tegra210": "jetson-nano",
    "rockchip,rk3588": "rk3588",
    "rockchip,rk3588s": "rk3588",
}
_CPU_VENDORS = {"GenuineIntel": "x86-intel", "AuthenticAMD": "x86-amd"}


@dataclass(frozen=True)
class Board:
    platform: str
    """jetson-orin, jetson-xavier, jetson-nano, rk3588, x86-intel, x86-amd or unknown."""
    model: str | None = None
    compatible: tuple[str, ...] = ()
    l4t: str | None = None
    """L4T release of a Jetson, e.g. "R36.4.7"."""


def parse_compatible(raw: str) -> tuple[str, ...]:
    return tuple(entry for entry in raw.split("\x00") if entry)


def parse_l4t(raw: str) -> str | None:
    """`# R36 (release), REVISION: 4.7, ...` -> `R36.4.7`."""
    release = re.search(r"R(\d+)", raw)
    revision = re.search(r"REVISION:\s*([\d.]+)", raw)
    if not release:
        return None
    return f"R{release.group(1)}" + (f".{revision.group(1)}" if revision else "")


def parse_cpu_vendor(cpuinfo: str) -> str | None:
    match = re.search(r"^vendor_id\s*:\s*(\S+)", cpuinfo, re.MULTILINE)
    return match.group(1) if match else None


def detect(root: str | Path) -> Board:
    root = Path(root)
    compatible = parse_compatible(try_read_text(root / "proc/device-tree/compatible") or "")
    model_raw = try_read_text(root / "proc/device-tree/model")
    model = model_raw.strip("\x00\n ") if model_raw else None
    release = try_read_text(root / "etc/nv_tegra_release")
    l4t = parse_l4t(release) if release else None
    for entry in compatible:
        if entry in _SOCS:
            return Board(_SOCS[entry], model, compatible, l4t)
    vendor = parse_cpu_vendor(try_read_text(root / "proc/cpuinfo") or "")
    if vendor in _CPU_VENDORS:
        return Board(_CPU_VENDORS[vendor], _dmi_model(root), compatible, l4t)
    return Board("unknown", model, compatible, l4t)


def _dmi_model(root: Path) -> str | None:
    dmi = root / "sys/class/dmi/id"
    parts = [(try_read_text(dmi / name) or "").strip() for name in ("sys_vendor", "product_name")]
    return " ".join(part for part in parts if part) or None
