"""The adaptive policy's state between decisions (governors/adaptive.py): its level, the times
that pace its moves, the temperatures its forecast is fitted to and the power it learned. Pure
data."""

from __future__ import annotations

from dataclasses import dataclass

from governors.peaks import Peaks, Recent, by_level


@dataclass(frozen=True)
class AdaptiveState:
    level: int
    """Index into the levels, lowest first."""
    changed_at: float = -1e9
    raised_at: float | None = None
    """When the last raise happened, while it may still be undone."""
    raise_interval_s: float = 2.0
    temps: tuple[tuple[float, float], ...] = ()
    """(time, °C) of recent temperature samples, oldest first."""
    raises: tuple[float, ...] = ()
    """When the raises of the last minute happened."""
    learned_w: Peaks = ()
    """Each level's peak, measured there once settled (governors/peaks.py)."""
    recent_w: Recent = ()
    """The settled readings at this level that its peak is learned from."""
    suspect_w: tuple[int, float] | None = None
    """(level, watts): a reading over the limit at a level read a while, not (yet) its peak: a
    spike, or a load that rose. The first settled reading after the cut tells which."""


def learned(state: AdaptiveState) -> dict[int, float]:
    """Each level's learned peak, in watts."""
    return by_level(state.learned_w)
