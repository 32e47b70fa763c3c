"""The kernel's CPU list format, "0-3,8-11,14" (cpulist_parse, the "%*pbl" printf format): how
sysfs prints sets of CPUs (cpu/online, topology/*_list, node*/cpulist, cpu_core/cpus) and how the
config names them (`[[models]] cpus`). docs/cpu-topology.md cites the ABI.

Only plain numbers and ascending ranges: the kernel prints nothing else, and the stride groups
cpulist_parse also takes ("0-15:2/4") are left out of the config on purpose, so that one reading
of a list is the only one. The empty list is a list (a memory-only NUMA node's cpulist is "\\n").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_CPU = 8191
"""The largest CPU number any kernel config allows (CONFIG_NR_CPUS is at most 8192); a larger one
is a mistake, not a CPU."""

_LIST = re.compile(r"(?:[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*)?", re.ASCII)


def parse(text: str) -> frozenset[int] | None:
    """The CPUs a list names; None when it is not one (a range that runs backwards included)."""
    text = text.strip("\x00 \t\n")
    if not _LIST.fullmatch(text):
        return None
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if low > high or high > MAX_CPU:
            return None
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def parse_words(text: str) -> frozenset[int] | None:
    """The CPUs of a space-separated list ("0 1 2 3 \\n", cpufreq's related_cpus); None when it is
    not one."""
    words = text.split()
    if not words or not all(word.isdigit() and int(word) <= MAX_CPU for word in words):
        return None
    return frozenset(int(word) for word in words)


def format_list(cpus: Iterable[int]) -> str:
    """The list as the kernel prints it: "0-3,8" ("" for none)."""
    ordered = sorted(set(cpus))
    parts = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        low, high = ordered[start], ordered[end]
        parts.append(str(low) if low == high else f"{low}-{high}")
        start = end + 1
    return ",".join(parts)
