"""The words of the loop's reports: what the log line says and what the event carries.

Pure: each returns the `Event` (its message is the log line); the loop logs and publishes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from governors import Readings, Verdict
from mcpd.events import Event
from mcpd.governor.actuation import CapChange


def action(
    verdict: Verdict,
    changes: Sequence[CapChange],
    batch: Mapping[str, tuple[int, int]],
    readings: Readings,
) -> Event:
    """`lower: policy0 1479 -> 922 MHz, batch demo 8 -> 5 (temperature 85.1 °C >= 85 °C)`"""

    def mhz(value: float | None) -> str:
        return "?" if value is None else f"{value:.0f}"

    def refused(change: CapChange) -> str:
        return "" if change.refused_s is None else f" (refused for {change.refused_s:.1f} s)"

    parts = [f"{c.domain} {mhz(c.old_mhz)} -> {mhz(c.new_mhz)} MHz{refused(c)}" for c in changes]
    parts += [f"batch {model} {old} -> {new}" for model, (old, new) in batch.items()]
    message = f"{verdict.action.value}: {', '.join(parts)} ({verdict.reason})"
    data = {
        "action": verdict.action.value,
        "reason": verdict.reason,
        "caps": {c.domain: {"old_mhz": c.old_mhz, "new_mhz": c.new_mhz} for c in changes},
        "batch": {model: {"old": old, "new": new} for model, (old, new) in batch.items()},
        "temperature_c": readings.temp_c,
        "power_w": readings.power_w,
    }
    return Event("governor", message, data)


def rediscovered(reason: str, temperatures: int, powers: int) -> Event:
    message = f"sensors re-discovered ({reason}): {temperatures} temperatures, {powers} powers"
    return Event("fault", message, {"reason": reason})


def ungoverned(root: Path, missing: Sequence[str], domains: bool) -> Event:
    """Nothing to govern by (no temperature sensor) or nothing to govern (no frequency domain);
    with no `missing`, governing again."""
    if not missing:
        message = "governing again: temperature sensors and frequency domains found"
    else:
        effect = (
            "every cap is held at its floor (fail-safe)" if domains else "no cap can be written"
        )
        message = f"nothing is governed: no {' and no '.join(missing)} found under {root}; {effect}"
    return Event("fault", message, {"missing": list(missing)})
