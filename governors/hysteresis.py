"""The hysteresis governor: readings in, a decision out. No I/O, no clock.

Rules (each threshold and factor overridable from [governor] in the config):

- temperature >= 85 °C or power >= 12 W: lower, current x 0.7, not below the minimum (800 MHz);
- temperature <= 75 °C and power <= 9 W: raise, current x 1.15, not above the maximum (3200 MHz);
- otherwise hold: the band between the thresholds is the hysteresis that stops ping-pong.

An unknown temperature (None) counts as hot: with no reading the only safe move is down. A board
without a power meter (power None, not metered) is governed by temperature alone, but a meter that
exists and has gone silent counts as over the limit, like an unknown temperature. The batch size
moves with the same conditions: down to floor(b x 0.7) (at least 1), up to ceil(b x 1.15) (at most
max_batch).

As the loop's policy (governors/policy.py) it steps every domain's target in force, the continuous
value and not the cap it snaps to (so that x1.15 steps climb a coarse table); its state is the
optional raise hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from governors.levels import DomainSteps
from governors.params import GovernorParams
from governors.policy import (
    Action,
    Caps,
    Decision,
    Domain,
    FullLoadW,
    Readings,
    Step,
    Verdict,
)


@dataclass(frozen=True)
class HysteresisGovernor:
    """The seed rule as a policy (governors/policy.py): its state is the raise hold."""

    params: GovernorParams = field(default_factory=GovernorParams)
    raise_hold_s: float = 0.0

    def start(
        self, domains: Sequence[DomainSteps], full_load_w: FullLoadW | None, before: object = None
    ) -> RaiseHold:
        return RaiseHold(self.raise_hold_s)

    def adopt(
        self, state: RaiseHold, domains: Sequence[DomainSteps], full_load_w: FullLoadW | None
    ) -> RaiseHold:
        return state

    def decide(
        self, readings: Readings, state: RaiseHold, now: float, domains: Sequence[Domain]
    ) -> Step[RaiseHold]:
        """Every domain's target in force stepped by the verdict (a hold moves none)."""
        verdict, hold = state.apply(self.verdict(readings), now)
        if verdict.action is Action.HOLD:
            return Step(verdict, {}, hold)
        targets = {
            d.name: self.step_mhz(verdict, d.target_mhz, d.low_mhz, d.high_mhz).new for d in domains
        }
        return Step(verdict, targets, hold)

    def learned_w(self, state: RaiseHold) -> Mapping[Caps, float] | None:
        return None

    def seeded(self, state: RaiseHold, peaks: Mapping[Caps, float], now: float) -> RaiseHold:
        return state

    def verdict(self, readings: Readings) -> Verdict:
        p = self.params
        temp, power = readings.temp_c, readings.power_w
        if temp is None:
            return Verdict(Action.LOWER, "temperature unknown (fail-safe)")
        if temp >= p.temp_high_c:
            return Verdict(Action.LOWER, f"temperature {temp:.1f} °C >= {p.temp_high_c:g} °C")
        if power is None and readings.metered:
            return Verdict(Action.LOWER, "power unknown, meter silent (fail-safe)")
        if power is not None and power >= p.power_high_w:
            return Verdict(Action.LOWER, f"power {power:.2f} W >= {p.power_high_w:g} W")
        if temp <= p.temp_low_c and (power is None or power <= p.power_low_w):
            watts = "" if power is None else f" and power {power:.2f} W <= {p.power_low_w:g} W"
            return Verdict(Action.RAISE, f"temperature {temp:.1f} °C <= {p.temp_low_c:g} °C{watts}")
        return Verdict(Action.HOLD, "inside the hysteresis band")

    def step_mhz(
        self,
        verdict: Verdict,
        current_mhz: float,
        min_mhz: float | None = None,
        max_mhz: float | None = None,
    ) -> Decision:
        """Move a frequency by the verdict, clamped to [min_mhz, max_mhz] (default: the governor's)."""
        p = self.params
        low = p.min_mhz if min_mhz is None else min_mhz
        high = p.max_mhz if max_mhz is None else max_mhz
        if verdict.action is Action.LOWER:
            new = max(current_mhz * p.down_factor, low)
        elif verdict.action is Action.RAISE:
            new = min(current_mhz * p.up_factor, high)
        else:
            new = current_mhz
        return Decision(verdict.action, verdict.reason, current_mhz, new)

    def step_batch(self, verdict: Verdict, current_batch: int, max_batch: int) -> Decision:
        p = self.params
        if verdict.action is Action.LOWER:
            new = max(1, math.floor(current_batch * p.down_factor))
        elif verdict.action is Action.RAISE:
            new = min(max_batch, math.ceil(current_batch * p.up_factor))
        else:
            new = current_batch
        return Decision(verdict.action, verdict.reason, current_batch, new)


@dataclass(frozen=True)
class RaiseHold:
    """Optional dwell before each raise: the readings must have stayed at or below the low
    thresholds for `hold_s` since they got there or since the last raise, whichever is later.

    Pure: the caller passes `now` and keeps the returned state.
    """

    hold_s: float
    low_since: float | None = None

    def apply(self, verdict: Verdict, now: float) -> tuple[Verdict, RaiseHold]:
        if self.hold_s <= 0:
            return verdict, self
        if verdict.action is not Action.RAISE:
            return verdict, RaiseHold(self.hold_s, None)
        since = now if self.low_since is None else self.low_since
        if now - since >= self.hold_s:
            return verdict, RaiseHold(self.hold_s, now)
        waited = f"raise held: {now - since:.1f} s of {self.hold_s:g} s below the low thresholds"
        return Verdict(Action.HOLD, waited), RaiseHold(self.hold_s, since)
