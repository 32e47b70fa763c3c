"""The one tolerant read primitive every sensor adapter uses.

Real kernels return errors from sensor attributes as a normal state: a disabled thermal zone gives
EINVAL, a power-gated Tegra zone EAGAIN on mainline, an INA3221 channel that is switched off ENODATA,
the hwmon of a down wifi device EIO, an unplugged device ENODEV (docs/sysfs.md §6.1). Such a read is
"unavailable for this sample": it must never raise into the control loop, and it must not flood the
journal at 10 Hz, so each attribute logs the first failure of an outage and its recovery only.
Any OSError counts, not just those: the daemon must not die of a sensor (RAPL's energy_uj answers
EACCES to non-root since Linux 5.10, CVE-2020-8694).

Nor may a file that is not a kernel attribute stop the loop. sysfs attributes are regular files of
at most one page whose values the kernel prints with `%d`-style formats (docs/sysfs.md §6.8), so
every open is non-blocking (a FIFO in a sensor's place would otherwise hang open() for good),
anything that is not a regular file (FIFO, device such as /dev/zero, socket) is a fault, a read is
bounded to one page and a longer file is a fault, and a value the kernel cannot print (`-0`, `+5`,
`007`, `1_000`) is a fault too.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
from pathlib import Path

from safefs import PAGE_SIZE, NotAFile, open_regular, read_text
from sensors.episodes import Episodes

log = logging.getLogger("mcpd.sensors")

# What the kernel's %d, %u, %ld and %lld print: no sign but "-", no leading zero, no "-0", at most
# the 19 digits of a 64-bit value.
_DECIMAL = re.compile(r"0|-?[1-9][0-9]{0,18}", re.ASCII)

_MAX_FAILURES = 1024
"""Far more attributes than a board has; the oldest episode is forgotten beyond it (paths that never
came back: a renumbered hwmon)."""
_FAILURES: Episodes[str] = Episodes(limit=_MAX_FAILURES)
"""Path -> why it is failing, for every attribute in a fault episode. Per path rather than per
Attribute, so that re-discovery (new Attribute objects for the same files) does not start a second
episode in the log. Only the control loop's thread reads sensors."""


def resolve(path: str | Path) -> str:
    """The path with every link resolved, as os.path.realpath gives it, in three system calls:
    realpath makes one lstat per component, and re-discovery resolved about fifteen paths of a
    dozen components or more (half its cost on a simulated board). A path that cannot be opened
    (missing, a dangling link) gets realpath's best effort."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)  # O_PATH: never opens the file itself
    except OSError:
        return os.path.realpath(path)
    try:
        resolved = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc
        return os.path.realpath(path)
    finally:
        os.close(fd)
    if resolved.startswith("/") and not resolved.endswith(" (deleted)"):
        return resolved
    return os.path.realpath(path)  # removed meanwhile, or outside this process's root


def try_read_text(path: str | Path) -> str | None:
    """A whole attribute (its first page), or None if it cannot be read: the one "read a value or
    None" for discovery (names, labels, types, ranges), where a missing optional attribute is normal
    and is not logged."""
    try:
        return read_text(path)
    except OSError:
        return None


def read_line(path: str | Path) -> str | None:
    """First line of an attribute without its newline, or None if it cannot be read."""
    text = try_read_text(path)
    return None if text is None else first_line(text)


def read_int(path: str | Path) -> int | None:
    """An integer attribute read once, or None if it cannot be read or is not a kernel integer."""
    line = read_line(path)
    return None if line is None else parse_int(line)


def first_line(text: str) -> str | None:
    """An attribute's first line without its newline, NULs or blanks; None when that is empty."""
    line = text.split("\n", 1)[0].strip("\x00 \t")
    return line or None


def parse_int(text: str) -> int | None:
    """Parse a decimal sysfs value ("41468\\n", "-256000\\n"); None for empty, non-numeric, or
    anything the kernel's integer formats cannot print."""
    text = text.strip("\x00 \t\n")
    return int(text) if _DECIMAL.fullmatch(text) else None


class Attribute:
    """One sysfs attribute read on every sample, tolerant of the errors real kernels return."""

    __slots__ = ("_fd", "_replaceable", "path")

    def __init__(self, path: str | Path) -> None:
        # Resolved once: opening through /sys/class/... symlinks costs a third more, and when the
        # device goes away the resolved path vanishes too, which is what `gone` wants.
        self.path = resolve(path)
        self._fd: int | None = None
        # A kernel attribute is never replaced while open (a removed one answers ENODEV), so only
        # a fake tree (the simulator, tests) needs the link-count check before each read.
        self._replaceable = not self.path.startswith("/sys/")

    def __repr__(self) -> str:
        return f"Attribute({self.path!r})"

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def open(self) -> None:
        """Open the descriptor before the first read, so that discovery pays for the open and not
        the first sample; a file that cannot be opened is left for that read to report."""
        if self._fd is None:
            with contextlib.suppress(OSError):
                self._fd = open_regular(self.path)

    def _read(self) -> str:
        """Read through a kept file descriptor: sysfs regenerates an attribute on every read at
        offset 0, so pread() costs a fifth of open+read+close. A file replaced under us (a test
        tree, the simulator's removed devices) has no links left: then, and after any error
        (a device going away answers ENODEV) or bad value, open the path afresh."""
        fd = self._fd
        if fd is not None:
            try:
                if not self._replaceable or os.fstat(fd).st_nlink:
                    return _page(fd)
            except OSError:
                pass
            self.close()
        fd = open_regular(self.path)
        try:
            text = _page(fd)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        return text

    def read_int(
        self, low: int | None = None, high: int | None = None, absent: int | None = None
    ) -> int | None:
        """The attribute's integer value; None if unreadable, non-numeric or outside [low, high].
        `absent` is the driver's own word for "no value now" (a power-gated zone): None as well,
        but a state the hardware is in, not a fault, so it is neither logged nor an outage."""
        try:
            text = self._read()
        except NotAFile as exc:
            self._failed(str(exc))
            return None
        except OSError as exc:
            self._failed(errno.errorcode.get(exc.errno or 0, str(exc)))
            return None
        value = parse_int(text)
        if value is None:
            self._failed(f"not a kernel integer: {text[:32]!r}")
            return None
        if value == absent:
            return None
        if (low is not None and value < low) or (high is not None and value > high):
            self._failed(f"implausible value {value}")
            return None
        return self._ok(value)

    def mark_implausible(self, value: float, unit: str) -> None:
        """For a value derived from several reads (RAPL deltas) that makes no physical sense."""
        self._failed(f"implausible value {value:g} {unit}")

    def _failed(self, why: str) -> None:
        # Whatever gave a bad value is not kept: the next read opens the path afresh (a file that
        # was replaced by a link to /dev/zero and then restored is read again).
        self.close()
        if _FAILURES.fail(self.path, why):
            log.warning("%s: unavailable (%s); logged once until it recovers", self.path, why)

    def _ok(self, value: int) -> int:
        if _FAILURES.succeed(self.path):
            log.info("%s: readable again", self.path)
        return value

    @property
    def failing(self) -> bool:
        return self.path in _FAILURES

    @property
    def gone(self) -> bool:
        """True once the file itself has vanished (hotplug, renumbered hwmon): time to re-discover."""
        return _FAILURES.why(self.path) == "ENOENT"


def _page(fd: int) -> str:
    data = os.pread(fd, PAGE_SIZE + 1, 0)
    if len(data) > PAGE_SIZE:
        raise NotAFile(f"longer than a sysfs attribute ({PAGE_SIZE} bytes)")
    return data.decode("ascii", errors="replace")


def list_dir(path: str | Path) -> list[str]:
    """Sorted entries of a sysfs directory; empty when it does not exist."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def device_name(path: str | Path) -> str:
    """Name of the device an hwmon/iio directory hangs off (`.../1-0040/hwmon/hwmon2` -> `1-0040`)."""
    parent = Path(resolve(path)).parent
    if parent.name == "hwmon":
        parent = parent.parent
    return parent.name
