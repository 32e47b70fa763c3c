"""The control loop's schedule and its own health: grid deadlines, and how late samples are taken
and how long a sample takes to become a cap write, over the whole run."""

from __future__ import annotations

from mcpd.percentiles import Durations
from mcpd.status import LoopDoc


class Grid:
    """Deadlines every `period_s` from `origin`, counted in whole nanoseconds: where two grids meet,
    their deadlines are the same float, so one tick takes both samples and decides once (issue 28:
    summed in floats, 0.1 s steps reached 0.6 s one ulp before 0.2 s steps did, and each sample
    became a decision of its own on the same readings)."""

    def __init__(self, origin: float, period_s: float) -> None:
        self._origin = origin
        self._period_ns = max(1, round(period_s * 1e9))
        self._offset_ns = 0
        self.deadline = origin

    def advance(self, now: float) -> None:
        """To the next grid point after `now`, skipping any that were missed."""
        self._move(self._period_ns)
        if self.deadline <= now:
            missed = int((now - self.deadline) * 1e9) // self._period_ns
            self._move(missed * self._period_ns)
            while self.deadline <= now:  # the float difference above can fall one period short
                self._move(self._period_ns)

    def _move(self, ns: int) -> None:
        self._offset_ns += ns
        self.deadline = self._origin + self._offset_ns / 1e9


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
