"""Operating levels, lowest first. Uniform levels: every distinct uniform cap (one fraction of each
domain's maximum) inside the governed ranges; the control benchmark's best fixed cap is the highest
feasible one. Stepped levels: the uniform ones with, between two neighbours, one level per domain
that moves, raising the domains one at a time; the adaptive policy walks these, so that a power
limit falling between two uniform levels (x86-amd: 10.1 W at 1700 MHz, 17.9 W at 2100 MHz on
every core) is held by a mix of the two instead of the lower one. Pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

CONTINUOUS_STEP_MHZ = 100.0
"""Grid for a domain without a frequency table (intel_pstate accepts any value)."""


@dataclass(frozen=True)
class DomainSteps:
    """A domain's maximum and the frequencies it may be capped at inside its governed range."""

    name: str
    max_mhz: float
    allowed_mhz: tuple[float, ...]


@dataclass(frozen=True)
class Level:
    fraction: float
    caps_mhz: tuple[tuple[str, float], ...]
    full_load_w: float | None = None
    """The board's power at these caps with every domain fully busy, where power is estimated
    from the Energy Model (the same formula at other clocks); None where a meter measures it."""
    uniform: bool = True
    """False for a level between two uniform ones (some domains raised, the others not yet)."""

    def cap(self, domain: str) -> float:
        return dict(self.caps_mhz)[domain]


def allowed_mhz(table_mhz: Sequence[float], low: float, high: float) -> tuple[float, ...]:
    """The table's entries inside [low, high] (the one nearest `low` if none is), or a grid."""
    if not table_mhz:
        steps = int((high - low) // CONTINUOUS_STEP_MHZ)
        grid = [low + i * CONTINUOUS_STEP_MHZ for i in range(steps + 1)]
        return tuple(grid if grid[-1] == high else [*grid, high])
    inside = sorted(f for f in table_mhz if low <= f <= high)
    return tuple(inside) or (min(table_mhz, key=lambda f: abs(f - low)),)


def uniform_levels(domains: Sequence[DomainSteps]) -> tuple[Level, ...]:
    if not domains:
        return ()
    fractions = sorted({f / d.max_mhz for d in domains for f in d.allowed_mhz})
    levels: list[Level] = []
    for fraction in fractions:
        caps = []
        for d in domains:
            below = [f for f in d.allowed_mhz if f <= fraction * d.max_mhz * (1 + 1e-9)]
            caps.append((d.name, max(below) if below else d.allowed_mhz[0]))
        if not levels or tuple(caps) != levels[-1].caps_mhz:
            levels.append(Level(fraction, tuple(caps)))
    return tuple(levels)


def stepped_levels(domains: Sequence[DomainSteps]) -> tuple[Level, ...]:
    """The uniform levels and, between two neighbours, the domains that differ raised one at a
    time in the order given; an in-between level's fraction is interpolated (it only orders the
    levels and scales power estimates between them)."""
    uniform = uniform_levels(domains)
    levels: list[Level] = []
    for lower, upper in itertools.pairwise(uniform):
        levels.append(lower)
        caps = dict(lower.caps_mhz)
        moving = [name for name, mhz in upper.caps_mhz if caps[name] != mhz]
        for done, name in enumerate(moving[:-1], start=1):
            caps[name] = upper.cap(name)
            share = done / len(moving)
            fraction = lower.fraction + share * (upper.fraction - lower.fraction)
            levels.append(Level(fraction, tuple(caps.items()), uniform=False))
    return (*levels, *uniform[-1:])


def uniform_below(levels: tuple[Level, ...], level: int) -> int:
    """The highest uniform level below `level`: a temperature cut moves every domain, as the
    seed rule's does (one domain at a time would answer heat too slowly)."""
    return max((i for i in range(level) if levels[i].uniform), default=0)


def uniform_above(levels: tuple[Level, ...], level: int) -> int:
    """The lowest uniform level above `level` (the top if none)."""
    return min(
        (i for i in range(level + 1, len(levels)) if levels[i].uniform), default=len(levels) - 1
    )
