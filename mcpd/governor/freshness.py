"""Sample ageing: the newest valid temperature and power, and what the governor may rely on.

A value older than `stale_s` (a sensor gone bad, a meter gone silent) is unknown, and an unknown
signal is a fault: said once when it starts and once when readings are back. A meter that has not
produced its first reading yet (RAPL needs two energy samples) is not a failed one: until it has
had `stale_s` to produce one, the board is governed by temperature alone.
"""

from __future__ import annotations

import logging

from governors import Readings
from mcpd.events import Event, EventBus
from sensors.episodes import Episodes

log = logging.getLogger("mcpd.governor.loop")


class Freshness:
    def __init__(self, events: EventBus, started: float) -> None:
        self.events = events
        self.started = started
        """When sampling began: the meter's grace period for its first reading starts here."""
        self.temperature: tuple[float, float] | None = None
        """The newest valid (°C, when)."""
        self.power: tuple[float, float] | None = None
        """The newest valid (W, when)."""
        self._unknown: Episodes[str] = Episodes()

    def readings(
        self, now: float, stale_s: float, metered: bool, estimated: bool = False
    ) -> Readings:
        """What the governor decides on at `now` (`estimated`: the power is the estimator's);
        faults are said as they start and end."""
        temp = _fresh(self.temperature, now, stale_s)
        power = _fresh(self.power, now, stale_s) if metered else None
        first_pending = self.power is None and now - self.started <= stale_s
        metered = metered and not first_pending
        self._note("temperature", temp is None and self.temperature is not None, stale_s)
        self._note("power", metered and power is None, stale_s)
        return Readings(
            temp,
            power,
            metered,
            estimated,
            temp_at=_when(temp, self.temperature),
            power_at=_when(power, self.power),
        )

    def _note(self, signal: str, unknown: bool, stale_s: float) -> None:
        if unknown and self._unknown.fail(signal):
            message = (
                f"{signal} unknown: no valid reading for {stale_s:g} s; stepping down (fail-safe)"
            )
            log.warning(message)
            self.events.publish(Event("fault", message, {"signal": signal, "stale_s": stale_s}))
        elif not unknown and self._unknown.succeed(signal):
            log.info("%s readings are back", signal)
            self.events.publish(
                Event("fault", f"{signal} readings are back", {"signal": signal, "recovered": True})
            )


def _when(fresh: float | None, sample: tuple[float, float] | None) -> float | None:
    return None if fresh is None or sample is None else sample[1]


def _fresh(sample: tuple[float, float] | None, now: float, stale_s: float) -> float | None:
    if sample is None or now - sample[1] > stale_s:
        return None
    return sample[0]
