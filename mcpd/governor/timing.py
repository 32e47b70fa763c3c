"""The control loop's schedule and its own health: grid deadlines, and how late samples are taken
and how long a sample takes to become a cap write, over the whole run."""

from __future__ import annotations

from mcpd.percentiles import Durations
from mcpd.status import LoopDoc


def next_deadline(deadline: float, period: float, now: float) -> float:
    """The next grid point after `now`, skipping any that were missed."""
    deadline += period
    if deadline <= now:
        deadline += ((now - deadline) // period + 1) * period
    return deadline


class LoopTiming:
    """How late samples are taken and how long a sample takes to become a cap write, over the whole
    run: the loop's own health, reported in the status document and measured by bench/."""

    def __init__(self) -> None:
        self.lateness_s = Durations()
        self.sample_to_write_s = Durations()

    def summary(self) -> LoopDoc:
        return {
            "sample_lateness": self.lateness_s.summary(),
            "sample_to_write": self.sample_to_write_s.summary(),
        }
