"""Cooling health: the board's own baseline of its thermal resistance, and the drift from it. Pure:
each accepted window's estimate (mcpd.governor.cooling_fit) in, the state and what changed out; no
files, no clock.

- Learning: the first `BASELINE_WINDOWS` accepted windows make the baseline, their median
  resistance, time constant and intercept (docs/cooling-health.md).
- Then each window's resistance is held against the baseline: its ratio is at or above
  `drift_warning` (1.25: +25 %), or below. Consecutive windows on one side are a run.
- Degraded: a run above that has lasted `sustained_s` (from the start of its first window to the
  end of its last) with at least `RUN_WINDOWS` windows; back to normal: a run below that has done
  the same. A window the fit did not accept (mcpd.governor.cooling_fit.assess) is no evidence
  either way: it neither extends nor breaks a run. Rising: above, not yet sustained.
- A warm room is not wear: the fit gives each window its own intercept, where the air's
  temperature goes, and the resistance is the slope (docs/cooling-health.md §2).

The figures reported are the medians of the last `RECENT` accepted windows; the confidence is how
well they agree, against the drift that would warn: (windows / RECENT) × (1 − their spread, max
less min over the median, / (drift_warning − 1)), at least 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mcpd.config import CoolingSection

BASELINE_WINDOWS = 4
RUN_WINDOWS = 3
RECENT = 3

Change = Literal["baseline", "degraded", "recovered"]


@dataclass(frozen=True)
class Estimate:
    start: float
    end: float
    """Of the window (or, for a baseline, of the windows it was made of), in the loop's clock."""
    r_c_per_w: float
    tau_s: float
    intercept_c: float


@dataclass(frozen=True)
class Run:
    above: bool
    """At or above `drift_warning`."""
    start: float
    windows: int


@dataclass(frozen=True)
class Health:
    """Everything the state is made of (and what the state folder keeps of it)."""

    baseline: Estimate | None = None
    learning: tuple[Estimate, ...] = ()
    """Accepted windows while there is no baseline yet."""
    recent: tuple[Estimate, ...] = ()
    run: Run | None = None
    degraded_since: float | None = None
    """The start of the run that made it degraded; None while it is not."""

    @property
    def state(self) -> Literal["learning", "normal", "rising", "degraded"]:
        if self.baseline is None:
            return "learning"
        if self.degraded_since is not None:
            return "degraded"
        return "rising" if self.run is not None and self.run.above else "normal"


def median(estimates: Sequence[Estimate], start: float, end: float) -> Estimate:
    return Estimate(
        start,
        end,
        statistics.median(e.r_c_per_w for e in estimates),
        statistics.median(e.tau_s for e in estimates),
        statistics.median(e.intercept_c for e in estimates),
    )


def step(
    health: Health, estimate: Estimate, settings: CoolingSection
) -> tuple[Health, Change | None]:
    """The health after one more accepted window, and what changed that is worth saying."""
    recent = (*health.recent, estimate)[-RECENT:]
    if health.baseline is None:
        learning = (*health.learning, estimate)
        if len(learning) < BASELINE_WINDOWS:
            return Health(None, learning, recent), None
        return Health(median(learning, learning[0].start, estimate.end), (), recent), "baseline"
    above = estimate.r_c_per_w >= settings.drift_warning * health.baseline.r_c_per_w
    run = health.run
    if run is None or run.above != above:
        run = Run(above, estimate.start, 1)
    else:
        run = Run(above, run.start, run.windows + 1)
    sustained = run.windows >= RUN_WINDOWS and estimate.end - run.start >= settings.sustained_s
    since = health.degraded_since
    change: Change | None = None
    if sustained and above and since is None:
        since, change = run.start, "degraded"
    elif sustained and not above and since is not None:
        since, change = None, "recovered"
    return Health(health.baseline, (), recent, run, since), change


@dataclass(frozen=True)
class Figures:
    """What the recent windows say, for the status."""

    now: Estimate | None
    confidence: float | None
    drift_ratio: float | None
    since: float | None
    """When the run above the warning began (degraded: the run that made it so)."""


def figures(health: Health, settings: CoolingSection) -> Figures:
    if not health.recent:
        return Figures(None, None, None, None)
    recent = health.recent
    now = median(recent, recent[0].start, recent[-1].end)
    spread = (max(e.r_c_per_w for e in recent) - min(e.r_c_per_w for e in recent)) / now.r_c_per_w
    confidence = len(recent) / RECENT * max(0.0, 1.0 - spread / (settings.drift_warning - 1.0))
    base = health.baseline
    if health.degraded_since is not None:
        since: float | None = health.degraded_since
    else:
        since = health.run.start if health.run is not None and health.run.above else None
    return Figures(
        now,
        confidence,
        None if base is None else now.r_c_per_w / base.r_c_per_w,
        since,
    )
