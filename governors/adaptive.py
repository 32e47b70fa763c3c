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
  100-140 ms). The estimate for a level (governors/level_power.py) is the peak measured there
  once settled (a learned map: an idle spell does not hide what a burst draws), else scaled from
  the highest level below with a peak; where power is itself an estimate (no meter), each level's
  Energy Model power at full load, against a limit lowered by `estimate_error`;
- a learned peak is robust and expires (governors/peaks.py); a reading over the limit at a
  level read a while cuts at once (the limit is held as the meter reads it) but is that level's
  peak only if the first reading after the cut, at lower caps, is above the level's peak (the
  load rose); else it was a spike, and the board comes back as fast as its raise budget allows;
- the same fail-safe as the seed rule: an unknown temperature, or a meter that went silent, cuts
  every cap by `down_factor` per decision.

Thresholds and clamps are the seed rule's (the levels are built inside the governed range). The
loop runs it through governors/adaptive_governor.py, which builds the levels from the domains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from governors.adaptive_state import AdaptiveState, learned
from governors.level_power import cut_estimate_w, estimate_w
from governors.levels import Level, uniform_above, uniform_below
from governors.params import GovernorParams
from governors.peaks import PeakRule
from governors.policy import Action, Readings, Verdict


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

    @property
    def ceiling_c(self) -> float:
        """Where the forecast may not go: `margin_c` below the threshold."""
        return self.params.temp_high_c - self.margin_c

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

    def raise_limit_w(self, state: AdaptiveState, target: int, limit_w: float) -> float:
        measured = target in learned(state)
        return limit_w * (self.learned_margin if measured else self.power_margin)

    def decide(
        self, state: AdaptiveState, readings: Readings, now: float, levels: tuple[Level, ...]
    ) -> tuple[Verdict, AdaptiveState]:
        """The verdict and the state at the level to run at next: the fail-safe first, then
        power over the limit, then heat, then a raise where there is room (the module's rules)."""
        if not levels:
            return Verdict(Action.HOLD, "nothing to govern"), state
        state = replace(state, level=min(max(state.level, 0), len(levels) - 1))
        state = replace(state, learned_w=self.peaks.expire(state.learned_w, now))
        temp = readings.temp_c
        if temp is None:
            return self._cut(state, levels, now, "temperature unknown (fail-safe)")
        if readings.power_w is None and readings.metered:
            return self._cut(state, levels, now, "power unknown, meter silent (fail-safe)")
        known_w = learned(state).get(state.level)
        state = self._learn(state, readings, now)
        over = self._power_cut(state, readings, now, levels, known_w)
        if over is not None:
            return over
        predicted = self.predicted_c(state)
        hot = self._heat_cut(state, temp, predicted, now, levels)
        if hot is not None:
            return hot
        return self._raise(self._forgive(state, now), readings, predicted, now, levels)

    def _power_cut(
        self,
        state: AdaptiveState,
        readings: Readings,
        now: float,
        levels: tuple[Level, ...],
        known_w: float | None,
    ) -> tuple[Verdict, AdaptiveState] | None:
        """Down to the highest level estimated under the limit, when the power now (or the peak
        known at this level, `known_w` before this reading) is at the trigger; None if neither."""
        power = readings.power_w
        limit_w = self.limit_w(readings)
        trigger_w = limit_w * self.power_trigger
        # A level known to draw over the limit at its peak (learned before a restart) is left
        # before the load arrives, not at the first meter window over the limit.
        peak_w = known_w if known_w is not None and state.level > 0 else 0.0
        settled = now - state.changed_at >= self.settle_s
        if power is None or max(power, peak_w) < trigger_w or not settled:
            return None
        if power > learned(state).get(state.level, power):
            state = replace(state, suspect_w=(state.level, power))
        target = next(
            (
                i
                for i in range(state.level - 1, -1, -1)
                if cut_estimate_w(state, levels, i, power, known_w, power >= trigger_w)
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
            else f"this level's learned peak {peak_w:.2f} W"
        )
        why = f"{over} >= {trigger_w:.2f} W ({self.power_trigger:g} x {of})"
        return self._move(state, target, now, why)

    def _heat_cut(
        self,
        state: AdaptiveState,
        temp: float,
        predicted: float | None,
        now: float,
        levels: tuple[Level, ...],
    ) -> tuple[Verdict, AdaptiveState] | None:
        """Every domain down at the threshold, one level down when heading over the ceiling near
        it, each once the last cut had time to act; None when neither applies."""
        if temp >= self.params.temp_high_c:
            if now - state.changed_at >= self.settle_s:
                why = f"temperature {temp:.1f} °C >= {self.params.temp_high_c:g} °C"
                return self._move(state, uniform_below(levels, state.level), now, why)
            return Verdict(Action.HOLD, "waiting for the last cut to act"), state
        heading = predicted is not None and predicted > self.ceiling_c
        if heading and temp >= self.params.temp_high_c - self.act_within_c:
            if now - state.changed_at >= self.lower_interval_s:
                why = f"temperature {temp:.1f} °C heading for {predicted:.1f} °C in {self.horizon_s:g} s"
                return self._move(state, state.level - 1, now, why)
            return Verdict(Action.HOLD, "waiting for the last cut to act"), state
        return None

    def _raise(
        self,
        state: AdaptiveState,
        readings: Readings,
        predicted: float | None,
        now: float,
        levels: tuple[Level, ...],
    ) -> tuple[Verdict, AdaptiveState]:
        """Up where the forecast leaves room, the raise budget and interval allow it and the
        next level's power is estimated under the limit; else hold."""
        temp, power = readings.temp_c, readings.power_w
        room = predicted is not None and predicted < self.ceiling_c - self.raise_margin_c
        recent = tuple(t for t in state.raises if now - t < 60.0)
        budget = len(recent) < self.max_raises_per_min
        waited = now - state.changed_at >= state.raise_interval_s
        if not (room and budget and waited and state.level < len(levels) - 1):
            return Verdict(Action.HOLD, "at the highest sustainable level"), state
        # Far from the temperature limit a whole uniform level at once (fewer changes; the die
        # has room), near it or where that would draw too much, one domain.
        targets = [state.level + 1]
        if temp is not None and temp < self.params.temp_high_c - self.act_within_c:
            targets.insert(0, uniform_above(levels, state.level))
        if power is not None and readings.metered:
            if now - state.changed_at < self.settle_s:
                return Verdict(Action.HOLD, "power settling"), state
            limit_w = self.limit_w(readings)
            drawn = [(t, estimate_w(state, levels, t, power)) for t in targets]
            allowed = [t for t, w in drawn if w < self.raise_limit_w(state, t, limit_w)]
            if not allowed:
                return Verdict(Action.HOLD, f"next level would draw ~{drawn[-1][1]:.1f} W"), state
            targets = allowed
        why = f"temperature {temp:.1f} °C, {predicted:.1f} °C in {self.horizon_s:g} s"
        verdict, state = self._move(state, targets[0], now, why)
        return verdict, replace(state, raised_at=now, raises=(*recent, now))

    def _learn(self, state: AdaptiveState, readings: Readings, now: float) -> AdaptiveState:
        """Keep the peak: the power a level draws under full load, not at the last idle spell,
        nor in a spike (governors/peaks.py). Each reading once, read after the last change
        settled, however many decisions see it (power read less often than temperature)."""
        power = readings.power_w
        taken = now if readings.power_at is None else readings.power_at
        if power is None or taken - state.changed_at < self.settle_s:
            return state
        if state.recent_w and state.recent_w[-1][0] >= taken:
            return state
        if state.suspect_w is not None and state.suspect_w[0] != state.level:
            # At lower caps, more than the level left drew at its peak: the load rose, and the
            # reading that cut was no spike. At most as much: it was one.
            level, watts = state.suspect_w
            state = replace(state, suspect_w=None)
            if power > learned(state).get(level, math.inf):
                learned_w = self.peaks.reached(state.learned_w, level, watts, taken)
                state = replace(state, learned_w=learned_w)
        recent, held = self.peaks.held(state.recent_w, power, taken)
        learned_w = self.peaks.reached(state.learned_w, state.level, held, taken)
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
