"""Decisions: the configured policy applied to the readings, moving the caps and batch sizes.

"hysteresis" steps every domain's target by the governor's factors (with the optional raise hold);
"adaptive" moves the domains between stepped levels built from their frequency tables.
The policies themselves are pure (governors/); this keeps the state they hand back between samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from governors import (
    Action,
    AdaptivePolicy,
    DomainSteps,
    HysteresisGovernor,
    Level,
    RaiseHold,
    Readings,
    Verdict,
    allowed_mhz,
    stepped_levels,
)
from mcpd.governor.actuation import Actuators, CapChange, DomainControl
from mcpd.governor.power_map import Caps


class PolicyDriver:
    def __init__(self, adaptive: AdaptivePolicy, raise_hold_s: float) -> None:
        self._hold = RaiseHold(raise_hold_s)
        self._adaptive = adaptive.start(())
        self.levels: tuple[Level, ...] = ()
        """The adaptive policy's levels for the domains governed now."""

    def decide(
        self,
        policy: str,
        governor: HysteresisGovernor,
        adaptive: AdaptivePolicy,
        readings: Readings,
        newest_temperature: tuple[float, float] | None,
        now: float,
        actuators: Actuators,
    ) -> tuple[Verdict, list[CapChange]]:
        """The verdict on `readings` and the caps written for it."""
        if policy != "adaptive":
            verdict, self._hold = self._hold.apply(governor.verdict(readings), now)
            return verdict, actuators.apply(governor, verdict)
        if newest_temperature is not None and readings.temp_c is not None:
            self._adaptive = adaptive.observe(self._adaptive, *newest_temperature)
        before = self._adaptive
        verdict, state = adaptive.decide(before, readings, now, self.levels)
        if actuators.pending:  # the power was drawn at caps that are no level's: not learned
            state = replace(state, learned_w=before.learned_w, recent_w=())
        if state.level != before.level and self.levels:
            self._adaptive = state
            return verdict, actuators.set_targets(dict(self.levels[state.level].caps_mhz))
        changes = actuators.write_wanted()
        # A level's caps written late: the power settles from now, as after any change.
        self._adaptive = replace(state, changed_at=now) if changes else state
        return verdict, changes

    def update_levels(
        self,
        controls: Mapping[str, DomainControl],
        full_load_w: Callable[[Mapping[str, float]], float] | None = None,
    ) -> None:
        """The adaptive policy's levels from the domains' tables and ranges (each with its power
        at full load where power is estimated); when they change, it continues from the highest
        level not above the one it was at, and keeps the power it learned at each set of caps
        that is still a level (a learned peak belongs to the caps, not to a level's index: a
        new range or a domain come or gone renumbers the levels)."""
        steps = [
            DomainSteps(name, c.domain.max_mhz, allowed_mhz(c.domain.available_mhz, c.low, c.high))
            for name, c in controls.items()
        ]
        levels = stepped_levels(steps)
        if full_load_w is not None:
            levels = tuple(
                replace(level, full_load_w=full_load_w(dict(level.caps_mhz))) for level in levels
            )
        if levels == self.levels:
            return
        fraction = self.levels[self._adaptive.level].fraction if self.levels else 1.0
        level = max((i for i, lv in enumerate(levels) if lv.fraction <= fraction), default=0)
        peaks = self._peaks()
        self.levels = levels
        self._adaptive = replace(self._adaptive, level=level, learned_w=(), recent_w=())
        self._merge(peaks)

    def learned_peaks(self) -> dict[Caps, float]:
        """The adaptive policy's learned peaks by caps."""
        return {caps: watts for caps, (watts, _) in self._peaks().items()}

    def seed(self, peaks: Mapping[Caps, float], now: float) -> None:
        """Peaks by caps learned before a restart, for the levels that have those caps now, as
        if reached at `now`; a peak learned since is kept where it is higher."""
        self._merge({caps: (watts, now) for caps, watts in peaks.items()})

    def _peaks(self) -> dict[Caps, tuple[float, float]]:
        """(watts, when last reached) by caps."""
        return {
            caps_key(self.levels[i]): (watts, at)
            for i, watts, at in self._adaptive.learned_w
            if i < len(self.levels)
        }

    def _merge(self, peaks: Mapping[Caps, tuple[float, float]]) -> None:
        index = {caps_key(level): i for i, level in enumerate(self.levels)}
        merged = {i: (watts, at) for i, watts, at in self._adaptive.learned_w}
        for caps, (watts, at) in peaks.items():
            i = index.get(caps)
            if i is not None and (i not in merged or watts > merged[i][0]):
                merged[i] = (watts, at)
        learned = tuple((i, watts, at) for i, (watts, at) in merged.items())
        self._adaptive = replace(self._adaptive, learned_w=learned)

    def reload(self, raise_hold_s: float, adaptive: AdaptivePolicy, restart_adaptive: bool) -> None:
        """New settings: the raise hold starts over; a new adaptive policy keeps the level and
        what was learned about power (a property of the board, not of the policy's settings)."""
        self._hold = RaiseHold(raise_hold_s)
        if restart_adaptive:
            self._adaptive = replace(
                adaptive.start(self.levels),
                level=self._adaptive.level,
                learned_w=self._adaptive.learned_w,
            )


def caps_key(level: Level) -> Caps:
    """A level's caps in domain order: what a learned peak belongs to, whatever the level's
    index (a new range or a domain come or gone renumbers the levels)."""
    return tuple(sorted(level.caps_mhz))


class BatchSizes:
    """Each model's batch size, moved by the same verdicts as the caps."""

    def __init__(self, max_batches: Mapping[str, int]) -> None:
        self.sizes: Mapping[str, int] = dict(max_batches)
        """A new mapping (never changed in place) after each change: one reference swap, so the
        batcher on another thread never sees a half-updated one."""

    def step(
        self, governor: HysteresisGovernor, verdict: Verdict, max_batches: Mapping[str, int]
    ) -> dict[str, tuple[int, int]]:
        """Move every model's batch size with `verdict`; returns the changed ones, (old, new)."""
        changed: dict[str, tuple[int, int]] = {}
        if verdict.action is Action.HOLD:
            return changed
        sizes = dict(self.sizes)
        for model, max_batch in max_batches.items():
            old = sizes.get(model, max_batch)
            new = int(governor.step_batch(verdict, old, max_batch).new)
            if new != old:
                sizes[model] = new
                changed[model] = (old, new)
        if changed:
            self.sizes = sizes
        return changed

    def reload(self, max_batches: Mapping[str, int]) -> None:
        """The configured models, each kept at its size but not above its new maximum."""
        self.sizes = {
            name: min(self.sizes.get(name, top), top) for name, top in max_batches.items()
        }
