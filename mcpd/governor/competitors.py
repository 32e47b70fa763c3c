"""Limits mcpd cannot meet alone, and others who move the same limits: said once, loudly.

- the kernel's passive trip points at or below mcpd's threshold (docs/competing-controllers.md);
- caps changed by another program: reported and followed instead of written back;
- a power or temperature limit the board exceeds with every domain at its floor
  (docs/power-modes.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from governors import GovernorParams, Readings
from mcpd.events import Event, EventBus
from mcpd.governor.actuation import DomainControl
from sensors import trips
from sensors.episodes import Episodes

log = logging.getLogger("mcpd.governor.loop")


def warn_about_kernel_trips(root: Path, threshold_c: float, events: EventBus) -> None:
    early = trips.passive_at_or_below(trips.discover(root), threshold_c)
    if not early:
        return
    listed = ", ".join(f"{t.zone} {t.celsius:g} °C" for t in early)
    message = (
        f"the kernel throttles too: passive trip points at or below mcpd's {threshold_c:g} °C "
        f"({listed}); both act on the same limits at the same time"
    )
    log.warning(message)
    data = {"trips": [{"zone": t.zone, "celsius": t.celsius} for t in early]}
    events.publish(Event("competitor", message, data))


def follow_external_caps(
    controls: Mapping[str, DomainControl],
    expected: Mapping[str, float | None],
    found: Mapping[str, float | None],
    events: EventBus,
) -> int:
    """Caps that read back different from what mcpd left there: each is reported, and its
    domain's target moves to it. Returns how many."""
    changed = 0
    for name, control in controls.items():
        before, now = expected.get(name), found.get(name)
        if before is None or now is None or abs(now - before) < 0.5:
            continue
        control.target = min(max(now, control.low), control.high)
        control.want(None)  # followed, not written back
        changed += 1
        message = (
            f"{name}: cap changed by another program, {before:.0f} -> {now:.0f} MHz; following it"
        )
        log.warning(message)
        data = {"domain": name, "expected_mhz": before, "found_mhz": now}
        events.publish(Event("competitor", message, data))
    return changed


FLOOR_SETTLE_S = {"power": 1.0, "temperature": 30.0}
"""How long every domain must have been at its floor before a reading over a limit means the
limit cannot be met there: the meters average over 100-140 ms and RAPL needs two energy samples
(docs/sensor-timing.md), and the die and heatsink cool for tens of seconds after a cut."""


class FloorLimits:
    """A limit the board exceeds with every domain at its floor cannot be met inside the clamp
    (AGX Orin at 12 W, a Jetson Nano at 40 °C ambient): said once per signal, for the whole run.
    Judged on readings taken after the floor has held a while, not on the reading that moved
    the caps there (a board at its top clocks draws more than at its floor)."""

    def __init__(self, events: EventBus) -> None:
        self.events = events
        self._said: Episodes[str] = Episodes()
        self._floor_since: float | None = None

    def check(
        self,
        controls: Iterable[DomainControl],
        readings: Readings,
        params: GovernorParams,
        now: float,
    ) -> None:
        """`controls` as they were when `readings` were taken (before this decision)."""
        floors = [c.target <= c.low for c in controls]
        if not floors or not all(floors):
            self._floor_since = None
            return
        if self._floor_since is None:
            self._floor_since = now
        for signal, value, limit, unit, key in (
            ("power", readings.power_w, params.power_high_w, "W", "power_high_w"),
            ("temperature", readings.temp_c, params.temp_high_c, "°C", "temp_high_c"),
        ):
            if value is None or value < limit or now - self._floor_since < FLOOR_SETTLE_S[signal]:
                continue
            if not self._said.fail(signal):
                continue
            message = (
                f"{signal} limit {limit:g} {unit} cannot be met: the board is at {value:.2f} {unit} "
                f"with every domain at its floor; raise [governor] {key} or lower min_mhz"
            )
            log.warning(message)
            data = {"signal": signal, "value": value, "limit": limit}
            self.events.publish(Event("fault", message, data))
