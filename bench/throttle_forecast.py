#!/usr/bin/env python3
"""`thermal.seconds_to_throttle` against the simulator: predicted vs actual time to 85 °C.

    .venv/bin/python bench/throttle_forecast.py [--profiles P ...] [--json]

For every profile, every domain is held at a fixed cap (1.0, 0.9 and 0.8 of its maximum,
snapped; no governor, so nothing changes the curve but the physics), at ambient 25 and 40 °C.
From the board at rest: 90 s of full load, 120 s idle (history the model is fitted on: it
forecasts nothing before it has seen the board respond to a change), then full load again until
the board passes 85 °C. The governing temperature and power are read through mcpd's
own sensors every 0.2 s of simulated time and fed to mcpd.governor.thermal_forecast.ThrottleForecast, as
the control loop does. Every second of the second load until the board passes 85 °C, the forecast
is compared with what then happened: error = |forecast − actual| / actual, over the moments where the actual time left
is more than 10 s (the goal: ≤ 20 %); a missing forecast (None) there counts as a miss. Runs
where the board never reaches 85 °C in 10 simulated minutes are reported as such: there every
non-None forecast is a false alarm.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.quality import POWER_COEFFICIENTS
from mcpd.governor import domains
from mcpd.governor.thermal_forecast import ThrottleForecast
from mcpd.sim import MEMORY_DIR, PROFILES, LoadSchedule, Simulator
from sensors import SensorSet
from sensors.discovery import PowerOptions

THRESHOLD_C = 85.0
STEP_S = 0.2
MINUTES = 10.0
MIN_AHEAD_S = 10.0
CAP_FRACTIONS = (1.0, 0.9, 0.8)
AMBIENTS = (25.0, 40.0)
LEARN_S = 90.0
IDLE_S = 120.0


def run(profile: str, fraction: float, ambient: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(dir=MEMORY_DIR) as folder:
        sim = Simulator(
            PROFILES[profile],
            Path(folder) / "board",
            load=LoadSchedule("sustained"),
            ambient_c=ambient,
        )
        sim.build()
        for domain in domains.discover(sim.root):
            domain.change_cap(domain.max_mhz * fraction)
        sensors = SensorSet.discover(sim.root, power=PowerOptions(coefficients=POWER_COEFFICIENTS))
        forecast = ThrottleForecast()
        now, crossed = 0.0, None
        made: list[tuple[float, float | None]] = []
        phases = ((LoadSchedule("sustained"), LEARN_S), (LoadSchedule("idle"), LEARN_S + IDLE_S))
        while now < LEARN_S + IDLE_S + MINUTES * 60 and crossed is None:
            sim.load = next((load for load, end in phases if now < end), LoadSchedule("sustained"))
            sim.advance(STEP_S)
            now += STEP_S
            watts = sensors.sample_powers(now).watts
            if watts is not None:
                forecast.add_power(now, watts)
            celsius = sensors.sample_temperatures().celsius
            if celsius is None:
                continue
            forecast.add(now, celsius)
            predicted = forecast.seconds_to(THRESHOLD_C, now)  # as every snapshot asks
            if now < LEARN_S + IDLE_S:
                continue
            if celsius >= THRESHOLD_C:
                crossed = now
            elif abs(now - round(now)) < STEP_S / 2:
                made.append((now, predicted))
    result: dict[str, object] = {"profile": profile, "cap_fraction": fraction, "ambient_c": ambient}
    if crossed is None:
        result["crossed_s"] = None  # seconds into the second load
        result["false_alarms"] = sum(f is not None for _, f in made)
        return result
    errors = []
    missed = 0
    for t, predicted in made:
        actual = crossed - t
        if actual <= MIN_AHEAD_S:
            continue
        if predicted is None:
            missed += 1
            continue
        errors.append(abs(predicted - actual) / actual)
    result.update(
        crossed_s=round(crossed - LEARN_S - IDLE_S, 1),
        forecasts=len(errors),
        missed=missed,
        median_error=round(statistics.median(errors), 3) if errors else None,
        max_error=round(max(errors), 3) if errors else None,
        within_20_percent=round(sum(e <= 0.2 for e in errors) / len(errors), 3) if errors else None,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profiles", nargs="+", default=sorted(PROFILES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [
        run(profile, fraction, ambient)
        for profile in args.profiles
        for fraction in CAP_FRACTIONS
        for ambient in AMBIENTS
    ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        "| profile | cap | ambient °C | 85 °C at s | forecasts > 10 s ahead | missed | median error | max error | ≤ 20 % |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["crossed_s"] is None:
            print(
                f"| {r['profile']} | {r['cap_fraction']} | {r['ambient_c']:.0f} | never | false alarms: {r['false_alarms']} | | | | |"
            )
            continue
        print(
            f"| {r['profile']} | {r['cap_fraction']} | {r['ambient_c']:.0f} | {r['crossed_s']} | {r['forecasts']} "
            f"| {r['missed']} | {r['median_error']} | {r['max_error']} | {r['within_20_percent']} |"
        )


if __name__ == "__main__":
    main()
