"""What a level draws, as the adaptive policy estimates it before it moves there. Pure.

Where power is itself estimated (no meter), each level carries the Energy Model's power at full
load. Where a meter measures it, what was learned decides: a level's peak (governors/peaks.py)
where it has one, else a scaling from what is known.
"""

from __future__ import annotations

import math

from governors.adaptive_state import AdaptiveState, learned
from governors.levels import Level


def estimate_w(
    state: AdaptiveState, levels: tuple[Level, ...], target: int, power_w: float
) -> float:
    """A level's power: the Energy Model's at full load where power is estimated; down,
    what the board draws now scaled by the plain ratio of fractions (static and board power
    stay), or the peak measured there if higher; up, the peak measured there, else the square of the
    ratio from the highest level below with a peak (a board at idle now says nothing about
    the next burst), else from now."""
    forecast = levels[target].full_load_w
    if forecast is not None:
        return forecast
    peaks = learned(state)
    if target < state.level:
        ratio = levels[target].fraction / levels[state.level].fraction
        return max(peaks.get(target, 0.0), power_w * ratio)
    if target in peaks:
        return max(peaks[target], power_w)
    below = [level for level in peaks if level < target]
    base, base_w = (max(below), peaks[max(below)]) if below else (state.level, power_w)
    # Static and board power do not scale: the square overestimates, on the safe side.
    ratio = levels[target].fraction / levels[base].fraction
    return base_w * ratio * ratio


def cut_estimate_w(
    state: AdaptiveState,
    levels: tuple[Level, ...],
    target: int,
    power_w: float,
    before_w: float | None,
    loaded: bool,
) -> float:
    """A lower level's power, for a cut. Where both it and the level now have a peak, its
    peak scaled by how much more the board draws now than the peak known here (a heavier
    load than when the peaks were learned); else the estimate_w one. A cut made on a learned
    peak rather than on the power now (`loaded` false: the load may be light now) only
    trusts levels with a peak of their own: the power now says nothing about them."""
    if levels[target].full_load_w is None:  # metered: what was learned decides
        peak = learned(state).get(target)
        if peak is not None and before_w:
            return peak * max(1.0, power_w / before_w)
        if peak is None and not loaded:
            return math.inf
    return estimate_w(state, levels, target, power_w)
