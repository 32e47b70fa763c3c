"""The dynamic batching rule, pure: what is queued and what time it is in, what to do out.

Triton's dynamic batcher (docs/serving-protocol.md §3), with the governor's current batch size as the
maximum: requests are taken in arrival order;
- a batch that reaches the size limit, or that cannot grow (the next request does not fit or has
  other non-batch dimensions), is sent at once;
- else, where preferred sizes are set and one can be formed, the largest such batch is sent at once;
- else the batch waits until its oldest request has waited `delay`, then is sent as it is.
One addition: the wait only happens while more rows are `expected`, i.e. while fewer rows are in
the system (queued or running) than at its recent peak. When everyone recently seen is already here
nobody else is coming to fill the batch: a lone client, or a few clients that each send one request
at a time, would otherwise wait the whole delay out on every request, for nothing.
A request larger than the limit (the governor lowered it below the request's own batch, which is
at most max_batch) is sent alone rather than refused.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Queued:
    rows: int
    """The request's batch dimension."""
    key: Hashable
    """Its other dimensions; only requests with equal keys can share a batch."""
    arrived: float


@dataclass(frozen=True)
class Dispatch:
    """What the batcher does now: run the first `take` requests as one batch, or wait."""

    take: int
    """How many requests from the front of the queue to run now; 0 means wait."""
    wait_until: float | None = None
    """When to decide again if nothing arrives first; None: until something arrives."""


def decide(
    queue: Sequence[Queued],
    now: float,
    limit: int,
    preferred: Collection[int],
    delay: float,
    expected: int,
) -> Dispatch:
    if not queue:
        return Dispatch(0)
    first = queue[0]
    if first.rows >= limit:
        return Dispatch(1)
    rows = count = best_preferred = 0
    blocked = False
    for item in queue:
        if item.key != first.key or rows + item.rows > limit:
            blocked = True
            break
        rows += item.rows
        count += 1
        if rows in preferred:
            best_preferred = count
    if rows == limit or blocked or expected <= 0:
        return Dispatch(count)
    if best_preferred:
        return Dispatch(best_preferred)
    deadline = first.arrived + delay
    if now >= deadline:
        return Dispatch(count)
    return Dispatch(0, deadline)


class RecentPeak:
    """The largest value seen over the last one to two windows (two alternating windows, so an
    old peak is forgotten within two windows without keeping every sample)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._start = float("-inf")
        self._current = 0
        self._previous = 0

    def see(self, value: int, now: float) -> None:
        if now - self._start >= self.window:
            recent = now - self._start < 2 * self.window
            self._previous = self._current if recent else 0
            self._current = 0
            self._start = now
        self._current = max(self._current, value)

    def value(self, now: float) -> int:
        self.see(0, now)
        return max(self._previous, self._current)
