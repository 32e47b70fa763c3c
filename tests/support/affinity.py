"""Where a process's threads may run, as the kernel says (proc(5))."""

from __future__ import annotations

import os

from sensors import cpulist


def allowed(pid: int) -> dict[int, frozenset[int]]:
    """Each thread of `pid` -> the CPUs it may run on (Cpus_allowed_list, proc(5))."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                line = next(x for x in status if x.startswith("Cpus_allowed_list:"))
        except (OSError, StopIteration):
            continue  # the thread ended meanwhile
        found[int(tid)] = cpulist.parse(line.split(":", 1)[1]) or frozenset()
    return found
