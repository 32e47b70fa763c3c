"""The adaptive policy: settle at the highest level the envelope sustains instead of cycling.

Pure: readings, the time and the previous state in; a verdict, the level to run at and the next
state out. It moves through stepped levels (governors/levels.py), where a level may differ from the
next by one domain:

- temperature is predicted `horizon_s` ahead from its slope over the last `slope_window_s` (a
  rise fading with `decay_s`); within `act_within_c` of `temp_high_c`, a predicted temperature
  above `temp_high_c - margin_c` lowers one level (at most every `lower_interval_s`, so the die
  can answer before the next cut); a reading at or above `temp_high_c` lowers every domain (to
  the uniform level below) at once;
- a raise needs the prediction `raise_margin_c` below that, a power estimate for the next level
  under the limit, `raise_interval_s` since the last change and fewer than `max_raises_per_min`
  raises in the last minute; it takes a whole uniform level while the board is more than
  `act_within_c` below `temp_high_c`, one level nearer; a raise undone within
  `undo_window_s` doubles that interval (up to `max_raise_interval_s`), a raise that holds halves
  it again: the back-off that keeps it from probing a level it cannot hold every few seconds;
- power at or above `power_trigger` x `power_high_w` (or a level whose learned peak is, as
  given back after a restart) jumps down to the highest level whose estimate is under the
  limit; power is not trusted for `settle_s` after a change (the meters average over
  100-140 ms). The estimate for a level (`estimate_w`) is the peak measured there
  once settled (a learned map: an idle spell does not hide what a burst draws), else scaled from
  the highest level below with a peak; where power is itself an estimate (no meter), each level's
  Energy Model power at full load, against a limit lowered by `estimate_error`;
- a learned peak is robust and expires (governors/peaks.py); a reading over the limit at a
  level read a while cuts at once (the limit is held as the meter reads it) but is that level's
  peak only if the first reading after the cut, at lower caps, is above the level's peak (the
  load rose); else it was a spike, and the board comes back as fast as its raise budget allows;
- the same fail-safe as the seed rule: an unknown temperature, or a meter that went silent, cuts
  every cap by `down_factor` per decision.

Thresholds and clamps are the seed rule's (the levels are built inside the governed range).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from governors.levels import Level
from governors.params import GovernorParams
from governors.peaks import PeakRule, Peaks, Recent, by_level
from governors.policy import Action, Readings, Verdict


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


@dataclass(frozen=True)
class AdaptivePolicy:
    params: GovernorParams = field(default_factory=GovernorParams)
    """Thresholds, the fail-safe step and the clamp: the seed rule's."""
    margin_c: float = 0.5
    raise_margin_c: float = 1.0
    act_within_c: float = 3.0
    """The prediction lowers only within this many degrees of temp_high_c: far below it a
    burst may run hot (the die and heatsink absorb it) and usually ends first."""
    horizon_s: float = 15.0
    decay_s: float = 10.0
    """A slope is projected as a rise that fades with this time constant, not a straight line:
    the die's share of a change arrives within seconds and its slope fades as it does."""
    slope_window_s: float = 4.0
    lower_interval_s: float = 2.0
    base_raise_interval_s: float = 2.0
    max_raise_interval_s: float = 60.0
    max_raises_per_min: int = 2
    """Each raise a burst's heat undoes is two changes: this keeps a board whose load comes and
    goes within a minute from changing its caps more than about twice that often."""
    undo_window_s: float = 20.0
    settle_s: float = 0.5
    power_margin: float = 0.97
    """A raise to a level not measured yet must be estimated under this fraction of the limit."""
    learned_margin: float = 0.995
    """A raise to a level measured before: its peak there must be under this fraction."""
    power_trigger: float = 0.995
    """Power at this fraction of the limit lowers: leakage creeps up with temperature at a fixed
    level, and the meter is read every 100 ms, so acting at the limit itself is too late."""
    peaks: PeakRule = field(default_factory=PeakRule)
    """How a level's peak is learned and forgotten."""
    estimate_error: float = 0.05
    """How far low an estimated power may read: the limit is divided by 1 + this when the power
    is the Energy Model estimate. 0.05 is the estimator's largest error against the simulated
    RK3588's true power, at mid-range clocks (docs/power-estimate.md)."""

    def limit_w(self, readings: Readings) -> float:
        """The power limit the readings are held to: lower when they are an estimate."""
        if readings.power_estimated:
            return self.params.power_high_w / (1.0 + self.estimate_error)
        return self.params.power_high_w

    def start(self, levels: tuple[Level, ...]) -> AdaptiveState:
        return AdaptiveState(len(levels) - 1, raise_interval_s=self.base_raise_interval_s)

    def predicted_c(self, state: AdaptiveState) -> float | None:
        if not state.temps:
            return None
        latest_t, latest_c = state.temps[-1]
        if len(state.temps) < 3:
            return latest_c
        times = [t for t, _ in state.temps]
        mean_t = sum(times) / len(times)
        mean_c = sum(c for _, c in state.temps) / len(state.temps)
        spread = sum((t - mean_t) ** 2 for t in times)
        slope = sum((t - mean_t) * (c - mean_c) for t, c in state.temps) / spread
        # The fitted line at the latest sample (less noisy than the sample), then ahead.
        ahead = self.decay_s * (1.0 - math.exp(-self.horizon_s / self.decay_s))
        return mean_c + slope * (latest_t - mean_t + ahead)

    def observe(self, state: AdaptiveState, temp_c: float | None, at: float) -> AdaptiveState:
        """Record a temperature sample taken at `at` (once per sample)."""
        if temp_c is None or (state.temps and state.temps[-1][0] >= at):
            return state
        recent = tuple(s for s in state.temps if at - s[0] < self.slope_window_s)
        return replace(state, temps=(*recent, (at, temp_c)))

    def estimate_w(
        self, state: AdaptiveState, levels: tuple[Level, ...], target: int, power_w: float
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
        self,
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
        return self.estimate_w(state, levels, target, power_w)

    def raise_limit_w(self, state: AdaptiveState, target: int, limit_w: float) -> float:
        measured = target in learned(state)
        return limit_w * (self.learned_margin if measured else self.power_margin)

    def decide(
        self, state: AdaptiveState, readings: Readings, now: float, levels: tuple[Level, ...]
    ) -> tuple[Verdict, AdaptiveState]:
        if not levels:
            return Verdict(Action.HOLD, "nothing to govern"), state
        state = replace(state, level=min(max(state.level, 0), len(levels) - 1))
        state = replace(state, learned_w=self.peaks.expire(state.learned_w, now))
        temp, power = readings.temp_c, readings.power_w
        if temp is None:
            return self._cut(state, levels, now, "temperature unknown (fail-safe)")
        if power is None and readings.metered:
            return self._cut(state, levels, now, "power unknown, meter silent (fail-safe)")
        settled = now - state.changed_at >= self.settle_s
        before = learned(state).get(state.level)
        taken = now if readings.power_at is None else readings.power_at
        if power is not None and taken - state.changed_at >= self.settle_s:
            state = self._learn(state, power, taken)
        limit_w = self.limit_w(readings)
        trigger_w = limit_w * self.power_trigger
        # A level known to draw over the limit at its peak (learned before a restart) is left
        # before the load arrives, not at the first meter window over the limit.
        known_w = before if before is not None and state.level > 0 else 0.0
        if power is not None and max(power, known_w) >= trigger_w and settled:
            if power > learned(state).get(state.level, power):
                state = replace(state, suspect_w=(state.level, power))
            target = next(
                (
                    i
                    for i in range(state.level - 1, -1, -1)
                    if self.cut_estimate_w(state, levels, i, power, before, power >= trigger_w)
                    < limit_w * self.power_margin
                ),
                0,
            )
            of = (
                f"the limit / {1 + self.estimate_error:g}, estimated"
                if readings.power_estimated
                else "the limit"
            )
            over = (
                f"power {power:.2f} W"
                if power >= trigger_w
                else f"this level's learned peak {known_w:.2f} W"
            )
            why = f"{over} >= {trigger_w:.2f} W ({self.power_trigger:g} x {of})"
            return self._move(state, target, now, why)
        if temp >= self.params.temp_high_c:
            if now - state.changed_at >= self.settle_s:
                return self._move(
                    state,
                    uniform_below(levels, state.level),
                    now,
                    f"temperature {temp:.1f} °C >= {self.params.temp_high_c:g} °C",
                )
            return Verdict(Action.HOLD, "waiting for the last cut to act"), state
        predicted = self.predicted_c(state)
        ceiling = self.params.temp_high_c - self.margin_c
        since = now - state.changed_at
        near = temp >= self.params.temp_high_c - self.act_within_c
        if predicted is not None and predicted > ceiling and near:
            if since >= self.lower_interval_s:
                why = f"temperature {temp:.1f} °C heading for {predicted:.1f} °C in {self.horizon_s:g} s"
                return self._move(state, state.level - 1, now, why)
            return Verdict(Action.HOLD, "waiting for the last cut to act"), state
        state = self._forgive(state, now)
        room = predicted is not None and predicted < ceiling - self.raise_margin_c
        recent = tuple(t for t in state.raises if now - t < 60.0)
        budget = len(recent) < self.max_raises_per_min
        if room and budget and state.level < len(levels) - 1 and since >= state.raise_interval_s:
            # Far from the temperature limit a whole uniform level at once (fewer changes; the
            # die has room), near it or where that would draw too much, one domain.
            targets = [state.level + 1]
            if not near:
                targets.insert(0, uniform_above(levels, state.level))
            if power is not None and readings.metered:
                if not settled:
                    return Verdict(Action.HOLD, "power settling"), state
                drawn = [(t, self.estimate_w(state, levels, t, power)) for t in targets]
                allowed = [t for t, w in drawn if w < self.raise_limit_w(state, t, limit_w)]
                if not allowed:
                    return Verdict(
                        Action.HOLD, f"next level would draw ~{drawn[-1][1]:.1f} W"
                    ), state
                targets = allowed
            why = f"temperature {temp:.1f} °C, {predicted:.1f} °C in {self.horizon_s:g} s"
            verdict, state = self._move(state, targets[0], now, why)
            return verdict, replace(state, raised_at=now, raises=(*recent, now))
        return Verdict(Action.HOLD, "at the highest sustainable level"), state

    def _learn(self, state: AdaptiveState, power: float, now: float) -> AdaptiveState:
        """Keep the peak: the power a level draws under full load, not at the last idle spell,
        nor in a spike (governors/peaks.py). Each reading once (`now`: when it was read), however
        many decisions see it (power read less often than temperature)."""
        if state.recent_w and state.recent_w[-1][0] >= now:
            return state
        if state.suspect_w is not None and state.suspect_w[0] != state.level:
            # At lower caps, more than the level left drew at its peak: the load rose, and the
            # reading that cut was no spike. At most as much: it was one.
            level, watts = state.suspect_w
            state = replace(state, suspect_w=None)
            if power > learned(state).get(level, math.inf):
                learned_w = self.peaks.reached(state.learned_w, level, watts, now)
                state = replace(state, learned_w=learned_w)
        recent, held = self.peaks.held(state.recent_w, power, now)
        learned_w = self.peaks.reached(state.learned_w, state.level, held, now)
        return replace(state, recent_w=recent, learned_w=learned_w)

    def _forgive(self, state: AdaptiveState, now: float) -> AdaptiveState:
        """A raise that held for undo_window_s halves the back-off."""
        if state.raised_at is not None and now - state.raised_at >= self.undo_window_s:
            interval = max(self.base_raise_interval_s, state.raise_interval_s / 2)
            return replace(state, raised_at=None, raise_interval_s=interval)
        return state

    def _move(
        self, state: AdaptiveState, target: int, now: float, why: str
    ) -> tuple[Verdict, AdaptiveState]:
        target = max(target, 0)
        if target == state.level:
            return Verdict(Action.HOLD, f"{why}; already at the lowest level"), state
        action = Action.RAISE if target > state.level else Action.LOWER
        interval = state.raise_interval_s
        undone = state.raised_at is not None and now - state.raised_at < self.undo_window_s
        if action is Action.LOWER and undone:
            interval = min(self.max_raise_interval_s, interval * 2)
        return Verdict(action, why), replace(
            state,
            level=target,
            changed_at=now,
            raised_at=None,
            raise_interval_s=interval,
            recent_w=(),
        )

    def _cut(
        self, state: AdaptiveState, levels: tuple[Level, ...], now: float, why: str
    ) -> tuple[Verdict, AdaptiveState]:
        """The seed rule's fail-safe step: the highest uniform level at or below down_factor x now
        (an in-between level's fraction is interpolated: some of its domains sit above it)."""
        limit = levels[state.level].fraction * self.params.down_factor
        target = max(
            (i for i, lv in enumerate(levels) if lv.uniform and lv.fraction <= limit), default=0
        )
        # LOWER even at the lowest level: the batch sizes still step down, as in the seed rule.
        return Verdict(Action.LOWER, why), self._move(state, target, now, why)[1]


def learned(state: AdaptiveState) -> dict[int, float]:
    """Each level's learned peak, in watts."""
    return by_level(state.learned_w)


def uniform_below(levels: tuple[Level, ...], level: int) -> int:
    """The highest uniform level below `level`: a temperature cut moves every domain, as the
    seed rule's does (one domain at a time would answer heat too slowly)."""
    return max((i for i in range(level) if levels[i].uniform), default=0)


def uniform_above(levels: tuple[Level, ...], level: int) -> int:
    """The lowest uniform level above `level` (the top if none)."""
    return min(
        (i for i in range(level + 1, len(levels)) if levels[i].uniform), default=len(levels) - 1
    )
