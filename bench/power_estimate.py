#!/usr/bin/env python3
"""The power estimator against the simulated board's true input power, over a load sweep.

    .venv/bin/python bench/power_estimate.py [--profile rk3588] [--seconds 60] [--json]

For every utilization level (0, 25, 50, 75, 100 % on every CPU, GPU and NPU) × cap fraction
(40, 70, 100 % of each domain's maximum, snapped), a fresh simulated board runs `--seconds` of
simulated time at 0.1 s steps; the estimate (sensors/estimate.py, read through mcpd's own
SensorSet as the daemon reads it) is compared with the plant's input power, which is what a
meter on the board's supply reads (the simulated RK3588 has none; the plant adds leakage that
rises with temperature and board power the estimator cannot see, and its voltage curve is not
the OPP table's). Each point's error is |mean estimate − mean true| / mean true over the last
half of the run. Two static terms: the configured default (`estimate_static_w`) and one learned
from the true power during 5 s at idle first, as the estimator learns from a meter. The RK3588
NPU's node has no `dynamic-power-coefficient`; the sweep configures 3600 µW/MHz/V² for it
(`[sensors] power_coefficients`), what calibrating it once against a meter gives, and reports
the sweep without it too.
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
from mcpd.sim import MEMORY_DIR, PROFILES, LoadSchedule, Simulator
from sensors import SensorSet
from sensors.discovery import PowerOptions

LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
CAP_FRACTIONS = (0.4, 0.7, 1.0)
STEP_S = 0.1
LEARN_S = 5.0


def point(
    profile: str, level: float, fraction: float, seconds: float, options: PowerOptions, learn: bool
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=MEMORY_DIR) as folder:
        sim = Simulator(PROFILES[profile], Path(folder) / "board", load=LoadSchedule("idle"))
        sim.build()
        sensors = SensorSet.discover(sim.root, power=options)
        estimator = sensors.estimator
        assert estimator is not None, f"{profile}: nothing to estimate"
        now = 0.0
        if learn:
            while now < LEARN_S:
                sim.advance(STEP_S)
                now += STEP_S
                sensors.sample_powers(now)
                estimator.learn(sim.state.input_w)
        for domain in domains.discover(sim.root):
            domain.change_cap(domain.max_mhz * fraction)
        sim.load = LoadSchedule("level", level)
        start = now
        estimates: list[float] = []
        truths: list[float] = []
        while now < start + seconds:
            sim.advance(STEP_S)
            now += STEP_S
            watts = sensors.sample_powers(now).watts
            if now >= start + seconds / 2 and watts is not None:
                estimates.append(watts)
                truths.append(sim.state.input_w)
        estimate, truth = statistics.fmean(estimates), statistics.fmean(truths)
        return {
            "level": level,
            "cap_fraction": fraction,
            "estimate_w": round(estimate, 3),
            "true_w": round(truth, 3),
            "error": round(abs(estimate - truth) / truth, 4),
            "static_w": round(estimator.static_w, 3),
        }


def sweep(profile: str, seconds: float, options: PowerOptions, learn: bool) -> dict[str, object]:
    points = [
        point(profile, level, fraction, seconds, options, learn)
        for level in LEVELS
        for fraction in CAP_FRACTIONS
    ]
    errors = [p["error"] for p in points]
    return {
        "profile": profile,
        "static": "learned at idle" if learn else f"configured {options.static_w} W",
        "npu_coefficient": bool(options.coefficients),
        "median_error": round(statistics.median(errors), 4),
        "max_error": round(max(errors), 4),
        "points": points,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="rk3588", choices=sorted(PROFILES))
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated, per point")
    parser.add_argument("--json", action="store_true", help="every point, as JSON")
    args = parser.parse_args()
    runs = [
        sweep(args.profile, args.seconds, PowerOptions("estimate", 4.0, coefficients), learn)
        for coefficients, learn in (
            (POWER_COEFFICIENTS, True),
            (POWER_COEFFICIENTS, False),
            ({}, True),
        )
    ]
    if args.json:
        print(json.dumps(runs, indent=1))
        return
    for run in runs:
        print(
            f"{run['profile']}: static {run['static']}, NPU coefficient "
            f"{'configured' if run['npu_coefficient'] else 'absent'}: median error "
            f"{run['median_error']:.1%}, max {run['max_error']:.1%}"
        )
        points = run["points"]
        assert isinstance(points, list)
        worst = max(points, key=lambda p: p["error"])
        print(f"  worst point: {worst}")


if __name__ == "__main__":
    main()
