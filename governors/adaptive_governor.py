"""The adaptive policy as the loop's policy (governors/policy.py): its levels built from the
governed domains and kept with its state, each level turned into the caps it stands for, and the
power it learned kept by caps. Pure.

The adaptive policy itself (governors/adaptive.py) walks level indices. A learned peak belongs to
a set of caps, not to an index: a new range or a domain come or gone renumbers the levels, and the
peaks follow their caps (a peak at caps that are no level any more is dropped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from governors.adaptive import AdaptivePolicy
from governors.adaptive_state import AdaptiveState
from governors.hysteresis import HysteresisGovernor
from governors.levels import DomainSteps, Level, stepped_levels
from governors.policy import Caps, Decision, Domain, FullLoadW, Readings, Step, Verdict


@dataclass(frozen=True)
class LevelState:
    """The adaptive policy's levels on the governed domains, and its state among them."""

    levels: tuple[Level, ...]
    adaptive: AdaptiveState


@dataclass(frozen=True)
class AdaptiveGovernor:
    policy: AdaptivePolicy = field(default_factory=AdaptivePolicy)

    def start(
        self, domains: Sequence[DomainSteps], full_load_w: FullLoadW | None, before: object = None
    ) -> LevelState:
        """From the top level; after a reload of the adaptive policy with other settings, from
        the level it was at, with what it learned about power (the board's, not the settings')."""
        if isinstance(before, LevelState):
            kept = replace(
                self.policy.start(before.levels),
                level=before.adaptive.level,
                learned_w=before.adaptive.learned_w,
            )
            return self.adopt(LevelState(before.levels, kept), domains, full_load_w)
        return self.adopt(LevelState((), self.policy.start(())), domains, full_load_w)

    def adopt(
        self, state: LevelState, domains: Sequence[DomainSteps], full_load_w: FullLoadW | None
    ) -> LevelState:
        """The levels from the domains' tables and ranges (each with its power at full load where
        power is estimated); when they change, it continues from the highest level not above the
        one it was at, and keeps the power it learned at each set of caps still a level."""
        levels = stepped_levels(domains)
        if full_load_w is not None:
            levels = tuple(
                replace(level, full_load_w=full_load_w(dict(level.caps_mhz))) for level in levels
            )
        if levels == state.levels:
            return state
        fraction = state.levels[state.adaptive.level].fraction if state.levels else 1.0
        level = max((i for i, lv in enumerate(levels) if lv.fraction <= fraction), default=0)
        renumbered = replace(state.adaptive, level=level, learned_w=(), recent_w=())
        return _merged(LevelState(levels, renumbered), _peaks(state))

    def decide(
        self, readings: Readings, state: LevelState, now: float, domains: Sequence[Domain]
    ) -> Step[LevelState]:
        """The level's caps as targets when the level changes; none otherwise."""
        before = state.adaptive
        written = max((d.changed_at for d in domains if d.changed_at is not None), default=None)
        if written is not None and written > before.changed_at:
            # A level's caps written late: the power settles from then, as after any change.
            before = replace(before, changed_at=written)
        if readings.temp_c is not None:
            taken = now if readings.temp_at is None else readings.temp_at
            before = self.policy.observe(before, readings.temp_c, taken)
        verdict, after = self.policy.decide(before, readings, now, state.levels)
        if any(d.pending for d in domains):  # the power was drawn at caps that are no level's
            after = replace(after, learned_w=before.learned_w, recent_w=())
        moved = after.level != before.level and bool(state.levels)
        targets = dict(state.levels[after.level].caps_mhz) if moved else {}
        return Step(verdict, targets, LevelState(state.levels, after))

    def step_batch(self, verdict: Verdict, current_batch: int, max_batch: int) -> Decision:
        """The seed rule's batch step."""
        return HysteresisGovernor(self.policy.params).step_batch(verdict, current_batch, max_batch)

    def learned_w(self, state: LevelState) -> dict[Caps, float]:
        """The learned peaks by caps."""
        return {caps: watts for caps, (watts, _) in _peaks(state).items()}

    def seeded(self, state: LevelState, peaks: Mapping[Caps, float], now: float) -> LevelState:
        """For the levels that have those caps now; a peak learned since is kept where higher."""
        return _merged(state, {caps: (watts, now) for caps, watts in peaks.items()})


def caps_key(level: Level) -> Caps:
    """A level's caps in domain order: what a learned peak belongs to."""
    return tuple(sorted(level.caps_mhz))


def _peaks(state: LevelState) -> dict[Caps, tuple[float, float]]:
    """(watts, when last reached) by caps."""
    return {
        caps_key(state.levels[i]): (watts, at)
        for i, watts, at in state.adaptive.learned_w
        if i < len(state.levels)
    }


def _merged(state: LevelState, peaks: Mapping[Caps, tuple[float, float]]) -> LevelState:
    index = {caps_key(level): i for i, level in enumerate(state.levels)}
    merged = {i: (watts, at) for i, watts, at in state.adaptive.learned_w}
    for caps, (watts, at) in peaks.items():
        i = index.get(caps)
        if i is not None and (i not in merged or watts > merged[i][0]):
            merged[i] = (watts, at)
    learned = tuple((i, watts, at) for i, (watts, at) in merged.items())
    return replace(state, adaptive=replace(state.adaptive, learned_w=learned))
