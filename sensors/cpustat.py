"""Per-CPU utilization from /proc/stat.

Each `cpuN` line holds the jiffies (USER_HZ) that CPU spent in user, nice, system, idle, iowait,
irq, softirq, steal, guest and guest_nice since boot (proc(5)); guest time is already counted in
user. Busy = everything but idle and iowait. A utilization is a difference of two reads, so the
first read only starts the interval. The file is longer than a page on real kernels (the `intr`
line), so only its head is read: the `cpu` lines come first. An offline CPU has no line.
"""

from __future__ import annotations

import os
from pathlib import Path

from safefs import open_regular

_HEAD_BYTES = 65536
_IDLE_FIELDS = (3, 4)  # idle, iowait
_COUNTED_FIELDS = 8  # user .. steal (guest and guest_nice are inside user and nice)


def parse(text: str) -> dict[int, tuple[int, int]]:
    """CPU number -> (busy, total) jiffies; lines that do not parse are skipped."""
    counters = {}
    for line in text.split("\n"):
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit():
            continue
        fields = rest.split()
        if len(fields) < 5 or not all(field.isdigit() for field in fields):
            continue
        values = [int(field) for field in fields[:_COUNTED_FIELDS]]
        total = sum(values)
        idle = sum(values[i] for i in _IDLE_FIELDS)
        counters[int(name[3:])] = (total - idle, total)
    return counters


class CpuStat:
    """Busy fraction of each CPU between successive reads."""

    def __init__(self, root: Path) -> None:
        self.path = root / "proc/stat"
        self._last: dict[int, tuple[int, int]] | None = None

    def _read(self) -> dict[int, tuple[int, int]] | None:
        try:
            fd = open_regular(self.path)
        except OSError:
            return None
        try:
            data = os.read(fd, _HEAD_BYTES)
        except OSError:
            return None
        finally:
            os.close(fd)
        text = data.decode("ascii", errors="replace")
        if len(data) == _HEAD_BYTES:  # the last line may be cut short
            text = text.rpartition("\n")[0]
        return parse(text)

    def busy(self) -> dict[int, float] | None:
        """CPU -> busy fraction (0..1) since the previous call; None on the first call or when
        the file cannot be read. A CPU whose counters went backwards (hotplug) counts as idle."""
        now = self._read()
        if now is None:
            return None
        last, self._last = self._last, now
        if last is None:
            return None
        fractions = {}
        for cpu, (busy, total) in now.items():
            before = last.get(cpu)
            if before is None or total <= before[1] or busy < before[0]:
                fractions[cpu] = 0.0
                continue
            fractions[cpu] = min((busy - before[0]) / (total - before[1]), 1.0)
        return fractions
