"""The power a level draws at its peak, as the adaptive policy learns it (issue 26). Pure.

A peak learned as the highest reading ever, kept for good, let one 250 ms spike bar a level for
the rest of the run (and, saved, after restarts): a board drawing 8 W of a 12 W limit stayed far
below the level its load fits. So a peak is

- robust: the `rank`-th highest settled reading of the last `window_s` at the level (the highest,
  while a visit has fewer readings, as one left at its first reading over the limit): a spike of
  fewer readings is not a peak, a load busy that many readings of the window is;
- raised by a higher one, and kept through idle spells (the next burst draws it again);
- forgotten `expiry_s` after it was last reached: the load that drew it may be gone, and a level
  never visited again would otherwise stay barred for good.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

Peaks = tuple[tuple[int, float, float], ...]
"""(level, peak watts, when last reached), most recently reached first."""
Recent = tuple[tuple[float, float], ...]
"""(time, watts) of the settled readings at the level in force, oldest first."""


@dataclass(frozen=True)
class PeakRule:
    window_s: float = 2.0
    rank: int = 5
    """The 5th highest of the last 2 s: a spike of up to four meter readings (a 250 ms one,
    smeared over 390 ms by a 140 ms meter window, at 100 ms sampling) is not a peak."""
    expiry_s: float = 600.0
    """Ten minutes keeps what a burst draws through the idle spells between bursts
    (BENCHMARKS.md: 60 s), and costs a level left for good at most one probe in that time."""
    kept: int = 64
    """The most levels with a peak."""

    def held(self, recent: Recent, watts: float, now: float) -> tuple[Recent, float]:
        """The readings of the window with this one, and the power held among them."""
        recent = (*(r for r in recent if now - r[0] < self.window_s), (now, watts))
        ranked = heapq.nlargest(self.rank, (w for _, w in recent))
        return recent, ranked[-1] if len(ranked) == self.rank else ranked[0]

    def reached(self, peaks: Peaks, level: int, watts: float, now: float) -> Peaks:
        """`level` drew `watts` at `now`: its peak, unless a higher one is known."""
        known = by_level(peaks).get(level)
        if known is not None and known > watts:
            return peaks
        others = tuple(entry for entry in peaks if entry[0] != level)
        return ((level, watts, now), *others[: self.kept - 1])

    def expire(self, peaks: Peaks, now: float) -> Peaks:
        kept = tuple(entry for entry in peaks if now - entry[2] < self.expiry_s)
        return peaks if len(kept) == len(peaks) else kept


def by_level(peaks: Peaks) -> dict[int, float]:
    """Each level's peak, in watts."""
    return {level: watts for level, watts, _ in peaks}
