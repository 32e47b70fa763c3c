"""The plan applied: sched_setaffinity(2) on the calling thread, which the threads it creates
from then on inherit (a thread's mask is copied at clone). Each process sets its own: the
governor before its first thread, the serving process on its event loop's thread when a
configuration arrives (it was started with the governor's mask), each model's worker on its
own thread, and a model's load on the loading thread while the runtime starts its pool there.
A refusal (a CPU gone offline since, a cpuset narrowed meanwhile) is logged and leaves the
thread where it was: the plan is advice, never a reason to fail."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Iterator

from sensors.cpulist import format_list

log = logging.getLogger("mcpd.placement")


def pin(cpus: Collection[int], what: str) -> bool:
    """Run the calling thread on `cpus`; False (logged) when the kernel refuses, or there are
    none to run on."""
    if not cpus:
        return False
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        log.warning("%s: not placed on CPUs %s: %s", what, format_list(cpus), exc.strerror)
        return False
    return True


@contextlib.contextmanager
def pinned(cpus: Collection[int], what: str) -> Iterator[None]:
    """The calling thread on `cpus` for the block, then back on the CPUs it had."""
    before = os.sched_getaffinity(0)
    placed = pin(cpus, what)
    try:
        yield
    finally:
        if placed:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, before)
