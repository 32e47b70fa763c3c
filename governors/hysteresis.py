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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from governors.params import GovernorParams


class Action(str, Enum):
    LOWER = "lower"
    RAISE = "raise"
    HOLD = "hold"


@dataclass(frozen=True)
class Readings:
    temp_c: float | None
    """Governing temperature; None = unknown (fail-safe: treated as hot)."""
    power_w: float | None = None
    """Governing power; None = no reading."""
    metered: bool = False
    """Whether the board has a power meter: if it has, a missing power reading is fail-safe."""
    power_estimated: bool = False
    """Whether power_w is the Energy Model estimate (no meter on the board, or `[sensors] power =
    "estimate"`) rather than a meter's reading: it can read a few percent low."""


@dataclass(frozen=True)
class Verdict:
    """Which way the readings say to move, and why."""

    action: Action
    reason: str


@dataclass(frozen=True)
class Decision:
    """A step of one quantity (a domain's target MHz, a model's batch size): what and why."""

    action: Action
    reason: str
    old: float
    new: float

    @property
    def changed(self) -> bool:
        return self.new != self.old


@dataclass(frozen=True)
class HysteresisGovernor:
    params: GovernorParams = field(default_factory=GovernorParams)

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
