"""Decisions: the configured policy applied to the readings, moving the caps and batch sizes.

The policy is pure (governors/policy.py: readings, its state, `now` and the domains in; a verdict,
targets and its next state out); this keeps its state between decisions and hands its targets to
the actuator. Which policy runs is the settings' business: nothing here knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from governors.levels import DomainSteps, allowed_mhz
from governors.policy import Action, Caps, FullLoadW, Policy, Readings, Verdict
from mcpd.governor.actuation import Actuators, CapChange, DomainControl


class PolicyDriver:
    def __init__(self, policy: Policy[Any]) -> None:
        self.policy = policy
        self._domains: tuple[DomainSteps, ...] = ()
        self._full_load_w: FullLoadW | None = None
        self.state: Any = policy.start((), None)
        """The policy's own, handed back to it at each decision."""

    def decide(
        self, readings: Readings, now: float, actuators: Actuators
    ) -> tuple[Verdict, list[CapChange]]:
        """The verdict on `readings` and the caps written for it."""
        step = self.policy.decide(readings, self.state, now, actuators.domains())
        self.state = step.state
        return step.verdict, actuators.move(step.targets, now)

    def adopt(
        self, controls: Mapping[str, DomainControl], full_load_w: FullLoadW | None = None
    ) -> None:
        """The governed domains changed (or may have): each one's caps inside its range, and
        (where power is estimated) the board's power at full load at any caps."""
        self._domains = tuple(
            DomainSteps(name, c.domain.max_mhz, allowed_mhz(c.domain.available_mhz, c.low, c.high))
            for name, c in controls.items()
        )
        self._full_load_w = full_load_w
        self.state = self.policy.adopt(self.state, self._domains, full_load_w)

    def reload(self, policy: Policy[Any]) -> None:
        """New settings: another policy, or this one with other settings, starts from the state
        in force (each keeps what still holds for it); the same policy goes on as it was."""
        if policy != self.policy:
            self.state = policy.start(self._domains, self._full_load_w, self.state)
            self.policy = policy

    def learned_w(self) -> Mapping[Caps, float] | None:
        """The power the policy learned by caps (None: it learns none)."""
        return self.policy.learned_w(self.state)

    def seed(self, peaks: Mapping[Caps, float], now: float) -> None:
        """Peaks by caps learned before a restart, as if reached at `now`."""
        self.state = self.policy.seeded(self.state, peaks, now)


class BatchSizes:
    """Each model's batch size, moved by the same verdicts as the caps."""

    def __init__(self, max_batches: Mapping[str, int]) -> None:
        self.sizes: Mapping[str, int] = dict(max_batches)
        """A new mapping (never changed in place) after each change: one reference swap, so the
        batcher on another thread never sees a half-updated one."""

    def step(
        self, policy: Policy[Any], verdict: Verdict, max_batches: Mapping[str, int]
    ) -> dict[str, tuple[int, int]]:
        """Move every model's batch size with `verdict`; returns the changed ones, (old, new)."""
        changed: dict[str, tuple[int, int]] = {}
        if verdict.action is Action.HOLD:
            return changed
        sizes = dict(self.sizes)
        for model, max_batch in max_batches.items():
            old = sizes.get(model, max_batch)
            new = int(policy.step_batch(verdict, old, max_batch).new)
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
