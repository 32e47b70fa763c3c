"""How busy a devfreq device (GPU, NPU) is, from its `load` attribute.

Rockchip's kernels print `<percent>@<Hz>Hz` there, e.g. `22@300000000Hz` (docs/sysfs.md §3.5): the
busy percentage over the last polling interval and the frequency it ran at. Values above 100 (an
overflowing counter, docs/sysfs.md §6) are clamped; anything else that does not parse is None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sensors.sysfs import read_line

_LOAD = re.compile(r"(0|[1-9][0-9]{0,5})@(0|[1-9][0-9]{0,11})Hz", re.ASCII)


@dataclass(frozen=True)
class DevfreqLoad:
    busy: float
    """0..1"""
    khz: int


def parse(text: str | None) -> DevfreqLoad | None:
    match = _LOAD.fullmatch(text or "")
    if match is None:
        return None
    return DevfreqLoad(min(int(match.group(1)), 100) / 100, int(match.group(2)) // 1000)


def load_path(root: Path, name: str) -> Path:
    return root / "sys/class/devfreq" / name / "load"


def read(root: Path, name: str) -> DevfreqLoad | None:
    return parse(read_line(load_path(root, name)))
