"""Frequency domains: the knobs mcpd turns (cpufreq policies, GPU/NPU devfreq devices).

cpufreq `policyN`: `scaling_max_freq` caps it, `cpuinfo_min/max_freq` bound it and
`scaling_available_frequencies` lists its table where the driver has one (intel_pstate has none);
all in kHz. devfreq `<device>`: `max_freq` caps it, `available_frequencies` is its table; in Hz.
A cap is written snapped to the highest available frequency not above it (never below the governed
range's floor, nor the lowest), and only when it differs from the current cap. Saving the original
cap first is the owner's job (mcpd.governor.actuation with mcpd.governor.baseline), not the domain's.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from safefs import UnsafeFileError
from sensors.sysfs import first_line, list_dir, parse_int, read_int, read_line

log = logging.getLogger("mcpd.governor.domains")

DomainKind = Literal["cpufreq", "devfreq"]
_UNITS_PER_MHZ = {"cpufreq": 1_000, "devfreq": 1_000_000}

# devfreq devices mcpd governs, by name token or device-tree node name: Jetson `17000000.gpu`
# (JP6), `17000000.ga10b` (JP5), `17000000.gv11b`, `57000000.gpu`, Thor `gpu-gpc-0`; RK3588
# `fb000000.gpu(-mali)` and `fdab0000.npu` (docs/sysfs.md §1-3). Memory (`dmc`) and bus
# devfreqs are left alone: capping DDR starves every engine at once.
_GOVERNED_TOKENS = frozenset({"gpu", "npu", "mali", "ga10b", "gv11b", "gp10b", "gb10b"})


class DomainWriteError(Exception):
    pass


class Knob:
    """One attribute of a domain (its cap, its current frequency), kept open between uses.

    Opened without following any link the kernel's own layout does not have: the domain's folder
    is resolved (class entries are symlinks into /sys/devices) and must lie under the sysfs root,
    every component of that resolved path is then opened with O_NOFOLLOW (a component swapped for a
    link fails instead of redirecting the write), and the attribute itself must be a regular file,
    not a link. A cap is written as root by `mcpd restore`, so a link anywhere a less privileged user
    could have placed one must never be followed. Kept open, a write needs no free descriptor (a
    flood of clients exhausting the process's descriptors cannot stop throttling) and costs one
    system call. A file replaced under us (tests, the simulator) has no links left: reopen it.
    """

    __slots__ = ("_fds", "folder", "name", "root")

    def __init__(self, root: Path, folder: Path, name: str) -> None:
        self.root = root
        self.folder = folder
        self.name = name
        self._fds: dict[int, int] = {}
        """Open flags (O_RDONLY or O_WRONLY) -> descriptor."""

    @property
    def path(self) -> Path:
        return self.folder / self.name

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _open(self, flags: int) -> int:
        fd = self._fds.get(flags)
        if fd is not None:
            try:
                if os.fstat(fd).st_nlink:
                    return fd
            except OSError:
                pass
            os.close(self._fds.pop(flags))
        real_root = os.path.realpath(self.root)
        real_folder = os.path.realpath(self.folder)
        if os.path.commonpath([real_root, real_folder]) != real_root:
            raise UnsafeFileError(
                errno.EXDEV, f"resolves to {real_folder}, outside the sysfs root {real_root}"
            )
        folder = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in Path(real_folder).relative_to(real_root).parts:
                inner = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder
                )
                os.close(folder)
                folder = inner
            try:
                fd = os.open(
                    self.name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
                )
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise UnsafeFileError(exc.errno, "is a symlink") from None
                raise
        finally:
            os.close(folder)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UnsafeFileError(errno.EINVAL, "is not a regular file")
        self._fds[flags] = fd
        return fd

    def open(self, flags: int) -> None:
        """Open ahead of the first use; a refusal is left for that use to report."""
        with contextlib.suppress(OSError):
            self._open(flags)

    def read(self) -> str | None:
        """The attribute's text; None if it cannot be read (a refused file included)."""
        try:
            fd = self._open(os.O_RDONLY)
            return os.pread(fd, 4096, 0).decode("ascii", errors="replace")
        except OSError:
            self.close()
            return None

    def write(self, value: str) -> None:
        """Raises OSError (UnsafeFileError for a refused file)."""
        fd = self._open(os.O_WRONLY)
        data = value.encode("ascii")
        with contextlib.suppress(OSError):  # a kernel attribute needs no truncation; a file does
            os.ftruncate(fd, 0)
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(errno.EIO, "short write")


@dataclass(eq=False)
class FrequencyDomain:
    name: str
    kind: DomainKind
    path: Path
    hw_min: int
    """Hardware range and table in the knob's own unit (kHz for cpufreq, Hz for devfreq)."""
    hw_max: int
    table: tuple[int, ...] = ()
    root: Path = Path("/")
    """The sysfs root every knob of this domain must lie under."""
    _cap: Knob = field(init=False, repr=False)
    _cur: Knob = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cap, cur = (
            ("scaling_max_freq", "scaling_cur_freq")
            if self.kind == "cpufreq"
            else ("max_freq", "cur_freq")
        )
        self._cap = Knob(self.root, self.path, cap)
        self._cur = Knob(self.root, self.path, cur)

    @property
    def cap_path(self) -> Path:
        return self._cap.path

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

    def snap(self, mhz: float, floor_mhz: float | None = None) -> int:
        """The raw value a cap of `mhz` is written as: the highest table entry not above it, but
        never below `floor_mhz` (the governed range's floor) when an entry at or above that exists,
        and never below the lowest entry."""
        raw = min(max(round(mhz * self.per_mhz), self.hw_min), self.hw_max)
        if not self.table:
            return raw
        below = [value for value in self.table if value <= raw]
        snapped = max(below) if below else self.table[0]
        if floor_mhz is not None:
            floor = round(floor_mhz * self.per_mhz)
            if snapped < floor:
                snapped = min((v for v in self.table if v >= floor), default=snapped)
        return snapped

    def _mhz(self, knob: Knob) -> float | None:
        text = knob.read()
        raw = None if text is None else parse_int(text)
        return None if raw is None else raw / self.per_mhz

    def read_cap_mhz(self) -> float | None:
        return self._mhz(self._cap)

    def read_cur_mhz(self) -> float | None:
        return self._mhz(self._cur)

    def read_cap_text(self) -> str | None:
        """The cap exactly as the kernel shows it, for the baseline."""
        text = self._cap.read()
        return None if text is None else first_line(text)

    def change_cap(self, mhz: float, floor_mhz: float | None = None) -> tuple[float | None, float]:
        """Write the snapped cap unless it is already in force; returns the cap before (None if
        unreadable) and the cap in force after, read back, in MHz. A kernel may hold a cap lower
        than written (cpufreq's QoS: a thermal cooling device's own limit) and that is what is in
        force; a cap that reads back higher than written, or not at all, was not lowered: raises
        DomainWriteError, as for a write the kernel refuses (EBUSY, EINVAL)."""
        raw = self.snap(mhz, floor_mhz)
        text = self._cap.read()
        before = None if text is None else parse_int(text)
        old = None if before is None else before / self.per_mhz
        if before == raw:
            return old, raw / self.per_mhz
        self.write_raw(str(raw))
        text = self._cap.read()
        after = None if text is None else parse_int(text)
        if after is None:
            raise DomainWriteError(
                f"{self.name}: wrote {raw} to {self.cap_path}; it cannot be read back"
            )
        if after > raw:
            raise DomainWriteError(
                f"{self.name}: wrote {raw} to {self.cap_path}; the kernel kept {after}"
            )
        return old, after / self.per_mhz

    def open_knobs(self) -> None:
        """Open the cap for writing and the current frequency for reading at adoption, so that the
        first decision does not pay for the checked walk from the sysfs root (milliseconds: it
        made the first cap write of every run the slowest of the run). Nothing is written."""
        self._cap.open(os.O_WRONLY)
        self._cur.open(os.O_RDONLY)

    def write_raw(self, value: str) -> None:
        try:
            self._cap.write(value)
        except UnsafeFileError as exc:
            raise DomainWriteError(
                f"{self.name}: {self.cap_path} {exc.strerror}; refused, nothing written"
            ) from exc
        except OSError as exc:
            raise DomainWriteError(
                f"{self.name}: writing {value} to {self.cap_path}: {exc.strerror}"
            ) from exc

    def close(self) -> None:
        self._cap.close()
        self._cur.close()


def _parse_table(text: str | None) -> tuple[int, ...]:
    values = {parse_int(token) for token in (text or "").split()}
    return tuple(sorted(value for value in values if value is not None and value > 0))


def _cpufreq_domain(root: Path, path: Path) -> FrequencyDomain | None:
    hw_min = read_int(path / "cpuinfo_min_freq")
    hw_max = read_int(path / "cpuinfo_max_freq")
    if hw_min is None or hw_max is None or hw_min > hw_max:
        log.warning("%s: no readable cpuinfo_min/max_freq, not governed", path)
        return None
    table = _parse_table(read_line(path / "scaling_available_frequencies"))
    return FrequencyDomain(path.name, "cpufreq", path, hw_min, hw_max, table, root)


def _is_governed_devfreq(name: str, path: Path) -> bool:
    tokens = set(re.split(r"[.\-_]", name.lower()))
    of_node = read_line(path / "device/of_node/name")
    return bool(tokens & _GOVERNED_TOKENS) or (of_node is not None and of_node in _GOVERNED_TOKENS)


def _devfreq_domain(root: Path, path: Path) -> FrequencyDomain | None:
    table = _parse_table(read_line(path / "available_frequencies"))
    if table:
        return FrequencyDomain(path.name, "devfreq", path, table[0], table[-1], table, root)
    hw_min = read_int(path / "min_freq")
    hw_max = read_int(path / "max_freq")
    if hw_min is None or hw_max is None or hw_min > hw_max:
        log.warning("%s: no frequency table or range, not governed", path)
        return None
    return FrequencyDomain(path.name, "devfreq", path, hw_min, hw_max, (), root)


def _policy_number(entry: str) -> int:
    digits = entry.removeprefix("policy")
    return int(digits) if digits.isdigit() else 1 << 30


def discover(root: str | Path) -> list[FrequencyDomain]:
    root = Path(root)
    domains: list[FrequencyDomain] = []
    cpufreq = root / "sys/devices/system/cpu/cpufreq"
    for entry in sorted(list_dir(cpufreq), key=_policy_number):
        if entry.startswith("policy") and (domain := _cpufreq_domain(root, cpufreq / entry)):
            domains.append(domain)
    devfreq = root / "sys/class/devfreq"
    for entry in list_dir(devfreq):
        if _is_governed_devfreq(entry, devfreq / entry) and (
            domain := _devfreq_domain(root, devfreq / entry)
        ):
            domains.append(domain)
    return domains
