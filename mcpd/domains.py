"""Frequency domains: the knobs mcpd turns (cpufreq policies, GPU/NPU devfreq devices).

cpufreq `policyN`: `scaling_max_freq` caps it, `cpuinfo_min/max_freq` bound it and
`scaling_available_frequencies` lists its table where the driver has one (intel_pstate has none);
all in kHz. devfreq `<device>`: `max_freq` caps it, `available_frequencies` is its table; in Hz.
A cap is written snapped to the highest available frequency not above it (never below the lowest),
only when it differs from the current cap, and only after the original cap is in the baseline.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sensors.sysfs import list_dir, parse_int, read_line, read_text

if TYPE_CHECKING:
    from mcpd.baseline import Baseline

log = logging.getLogger("mcpd.domains")

DomainKind = Literal["cpufreq", "devfreq"]
_UNITS_PER_MHZ = {"cpufreq": 1_000, "devfreq": 1_000_000}

# devfreq devices mcpd governs, by name token or device-tree node name: Jetson `17000000.gpu`
# (JP6), `17000000.ga10b` (JP5), `17000000.gv11b`, `57000000.gpu`, Thor `gpu-gpc-0`; RK3588
# `fb000000.gpu(-mali)` and `fdab0000.npu` (sysfs-layouts.md §1-3). Memory (`dmc`) and bus
# devfreqs are left alone: capping DDR starves every engine at once.
_GOVERNED_TOKENS = frozenset({"gpu", "npu", "mali", "ga10b", "gv11b", "gp10b", "gb10b"})


class DomainWriteError(Exception):
    pass


@dataclass(eq=False)
class FrequencyDomain:
    name: str
    kind: DomainKind
    path: Path
    hw_min: int
    """Hardware range and table in the knob's own unit (kHz for cpufreq, Hz for devfreq)."""
    hw_max: int
    table: tuple[int, ...] = ()
    baseline: Baseline | None = field(default=None, repr=False)

    @property
    def cap_path(self) -> Path:
        return self.path / ("scaling_max_freq" if self.kind == "cpufreq" else "max_freq")

    @property
    def cur_path(self) -> Path:
        return self.path / ("scaling_cur_freq" if self.kind == "cpufreq" else "cur_freq")

    @property
    def per_mhz(self) -> int:
        return _UNITS_PER_MHZ[self.kind]

    @property
    def min_mhz(self) -> float:
        return self.hw_min / self.per_mhz

    @property
    def max_mhz(self) -> float:
        return self.hw_max / self.per_mhz

    @property
    def available_mhz(self) -> tuple[float, ...]:
        return tuple(value / self.per_mhz for value in self.table)

    def snap(self, mhz: float) -> int:
        """The raw value a cap of `mhz` is written as."""
        raw = min(max(round(mhz * self.per_mhz), self.hw_min), self.hw_max)
        if not self.table:
            return raw
        below = [value for value in self.table if value <= raw]
        return max(below) if below else self.table[0]

    def _read_raw(self, path: Path) -> int | None:
        try:
            return parse_int(read_text(path))
        except OSError:
            return None

    def read_cap_mhz(self) -> float | None:
        raw = self._read_raw(self.cap_path)
        return None if raw is None else raw / self.per_mhz

    def read_cur_mhz(self) -> float | None:
        raw = self._read_raw(self.cur_path)
        return None if raw is None else raw / self.per_mhz

    def read_cap_text(self) -> str | None:
        """The cap exactly as the kernel shows it, for the baseline."""
        return read_line(self.cap_path)

    def write_cap(self, mhz: float) -> float:
        """Write the snapped cap unless it is already in force; returns the cap in MHz.

        Raises DomainWriteError if the baseline cannot be saved first or the kernel refuses.
        """
        return self.change_cap(mhz)[1]

    def change_cap(self, mhz: float) -> tuple[float | None, float]:
        """write_cap, returning the cap before (None if unreadable) and after, in MHz."""
        raw = self.snap(mhz)
        before = self._read_raw(self.cap_path)
        old = None if before is None else before / self.per_mhz
        if before != raw:
            if self.baseline is not None:
                self.baseline.remember(self)
            self.write_raw(str(raw))
        return old, raw / self.per_mhz

    def write_raw(self, value: str) -> None:
        try:
            fd = os.open(self.cap_path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
            try:
                os.write(fd, value.encode("ascii"))
            finally:
                os.close(fd)
        except OSError as exc:
            raise DomainWriteError(
                f"{self.name}: writing {value} to {self.cap_path}: {exc.strerror}"
            ) from exc


def _parse_table(text: str | None) -> tuple[int, ...]:
    values = {parse_int(token) for token in (text or "").split()}
    return tuple(sorted(value for value in values if value is not None and value > 0))


def _cpufreq_domain(path: Path) -> FrequencyDomain | None:
    hw_min = parse_int(read_line(path / "cpuinfo_min_freq") or "")
    hw_max = parse_int(read_line(path / "cpuinfo_max_freq") or "")
    if hw_min is None or hw_max is None or hw_min > hw_max:
        log.warning("%s: no readable cpuinfo_min/max_freq, not governed", path)
        return None
    table = _parse_table(read_line(path / "scaling_available_frequencies"))
    return FrequencyDomain(path.name, "cpufreq", path, hw_min, hw_max, table)


def _is_governed_devfreq(name: str, path: Path) -> bool:
    tokens = set(re.split(r"[.\-_]", name.lower()))
    of_node = read_line(path / "device/of_node/name")
    return bool(tokens & _GOVERNED_TOKENS) or (of_node is not None and of_node in _GOVERNED_TOKENS)


def _devfreq_domain(path: Path) -> FrequencyDomain | None:
    table = _parse_table(read_line(path / "available_frequencies"))
    if table:
        return FrequencyDomain(path.name, "devfreq", path, table[0], table[-1], table)
    hw_min = parse_int(read_line(path / "min_freq") or "")
    hw_max = parse_int(read_line(path / "max_freq") or "")
    if hw_min is None or hw_max is None or hw_min > hw_max:
        log.warning("%s: no frequency table or range, not governed", path)
        return None
    return FrequencyDomain(path.name, "devfreq", path, hw_min, hw_max)


def _policy_number(entry: str) -> int:
    digits = entry.removeprefix("policy")
    return int(digits) if digits.isdigit() else 1 << 30


def discover(root: str | Path, baseline: Baseline | None = None) -> list[FrequencyDomain]:
    root = Path(root)
    domains: list[FrequencyDomain] = []
    cpufreq = root / "sys/devices/system/cpu/cpufreq"
    for entry in sorted(list_dir(cpufreq), key=_policy_number):
        if entry.startswith("policy") and (domain := _cpufreq_domain(cpufreq / entry)):
            domains.append(domain)
    devfreq = root / "sys/class/devfreq"
    for entry in list_dir(devfreq):
        if _is_governed_devfreq(entry, devfreq / entry) and (
            domain := _devfreq_domain(devfreq / entry)
        ):
            domains.append(domain)
    for domain in domains:
        domain.baseline = baseline
    return domains
