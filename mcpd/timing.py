"""The control loop's schedule and its own health: grid deadlines, and how late samples are taken
and how long a sample takes to become a cap write, over the whole run."""

from __future__ import annotations

import math


def next_deadline(deadline: float, period: float, now: float) -> float:
    """The next grid point after `now`, skipping any that were missed."""
    deadline += period
    if deadline <= now:
        deadline += ((now - deadline) // period + 1) * period
    return deadline


class Durations:
    """Durations counted in log-spaced buckets 2 % wide (1 µs to about a minute): percentiles of a
    whole run, start-up included, in constant memory and constant time per sample, to within 2 %;
    the maximum exactly. Appended by the loop, read by any thread."""

    _LOW_S = 1e-6
    _RATIO = 1.02
    _BUCKETS = int(math.log(60 / _LOW_S, _RATIO)) + 2

    def __init__(self) -> None:
        self._counts = [0] * self._BUCKETS
        self._count = 0
        self.max_s = 0.0

    def __len__(self) -> int:
        return self._count

    def clear(self) -> None:
        self._counts = [0] * self._BUCKETS
        self._count = 0
        self.max_s = 0.0

    def append(self, seconds: float) -> None:
        if seconds <= self._LOW_S:
            bucket = 0
        else:
            bucket = min(self._BUCKETS - 1, 1 + int(math.log(seconds / self._LOW_S, self._RATIO)))
        self._counts[bucket] += 1
        self._count += 1
        self.max_s = max(self.max_s, seconds)

    def quantile(self, q: float) -> float:
        """The upper edge of the bucket holding the q-th sample (never above the maximum)."""
        rank = max(1, math.ceil(q * self._count))
        seen = 0
        for bucket, count in enumerate(self._counts):
            seen += count
            if seen >= rank:
                return min(self._LOW_S * self._RATIO**bucket, self.max_s)
        return self.max_s

    def summary(self) -> dict[str, float] | None:
        if not self._count:
            return None

        def ms(seconds: float) -> float:
            return round(seconds * 1000, 3)

        return {
            "p50_ms": ms(self.quantile(0.5)),
            "p99_ms": ms(self.quantile(0.99)),
            "max_ms": ms(self.max_s),
            "count": self._count,
        }


class LoopTiming:
    """How late samples are taken and how long a sample takes to become a cap write, over the whole
    run: the loop's own health, reported in the status document and measured by bench/."""

    def __init__(self) -> None:
        self.lateness_s = Durations()
        self.sample_to_write_s = Durations()

    def summary(self) -> dict[str, dict[str, float] | None]:
        return {
            "sample_lateness": self.lateness_s.summary(),
            "sample_to_write": self.sample_to_write_s.summary(),
        }
