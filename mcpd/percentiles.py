"""Percentiles of durations in constant memory, for the control loop's timing and for request
latencies: the one implementation (it needs no numpy, so the governor can use it too)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from typing import TypedDict


class DurationSummary(TypedDict):
    p50_ms: float
    p99_ms: float
    max_ms: float
    count: int


class Durations:
    """Durations counted in log-spaced buckets 2 % wide (1 µs to about a minute): percentiles in
    constant memory and constant time per sample, to within 2 %; the maximum of the whole run
    exactly. Over the whole run, start-up included (the control loop's timing), or with `window`
    over the last `window` samples only (request latencies, which follow the load). Appended by one
    thread, read by any: a reader racing an append sees the sample counted or not."""

    _LOW_S = 1e-6
    _RATIO = 1.02
    _BUCKETS = int(math.log(60 / _LOW_S, _RATIO)) + 2

    def __init__(self, window: int | None = None) -> None:
        self._counts = [0] * self._BUCKETS
        self._count = 0
        self.max_s = 0.0
        self._recent: deque[int] | None = None if window is None else deque(maxlen=window)
        """The buckets of the samples in the window, oldest first."""

    def __len__(self) -> int:
        return self._count

    def clear(self) -> None:
        self._counts = [0] * self._BUCKETS
        self._count = 0
        self.max_s = 0.0
        if self._recent is not None:
            self._recent.clear()

    def append(self, seconds: float) -> None:
        if seconds <= self._LOW_S:
            bucket = 0
        else:
            bucket = min(self._BUCKETS - 1, 1 + int(math.log(seconds / self._LOW_S, self._RATIO)))
        recent = self._recent
        if recent is not None:
            if len(recent) == recent.maxlen:
                self._counts[recent[0]] -= 1
                self._count -= 1
            recent.append(bucket)
        self._counts[bucket] += 1
        self._count += 1
        self.max_s = max(self.max_s, seconds)

    def quantile(self, q: float) -> float:
        """The upper edge of the bucket holding the q-th sample (never above the maximum)."""
        rank = max(1, math.ceil(q * self._count))
        # In C (accumulate, bisect) rather than a Python loop over ~900 buckets: 114 us of a cold
        # status refresh, which asks for four quantiles a second.
        bucket = bisect.bisect_left(list(itertools.accumulate(self._counts)), rank)
        if bucket == self._BUCKETS:
            return self.max_s
        return min(self._LOW_S * self._RATIO**bucket, self.max_s)

    def summary(self) -> DurationSummary | None:
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
