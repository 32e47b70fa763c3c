#!/usr/bin/env python3
"""Cooling health against the simulator's cooling faults: the thermal resistance the daemon fits
against the plant's own, the time to flag wear, and no alarm for a warm room.

    .venv/bin/python bench/cooling_health.py [--profiles P ...] [--scenarios S ...] [--jobs 2]
        [--sample-s S] [--json]

Each run is the real ControlLoop (the hysteresis governor, as the daemon runs it, with
bench/quality.py's settings: a 12 W limit, 30 W on the AGX Orin) on a simulated board in simulated
time (a fake clock: deterministic), its cooling watch refreshed every simulated second as the
daemon's status path does, under bursts of full load (90 s on, 60 s off), with the daemon's
sampling (0.2 s, 0.1 s; `--sample-s` for another) and [cooling] defaults. The board learns its baseline over its first
hours; at 3 h 10 min (simulated, inside a window) comes the scenario's change:

- healthy:       nothing
- fan-stop:      the thermal resistance × 1.6 at once
- dust:          the thermal resistance rising linearly to × 1.5 over 6 h (+25 % 3 h into it)
- warm-room:     the air 10 °C warmer at once
- warm-afternoon: the air 10 °C warmer over 3 h

Reported: the baseline against the plant's resistance; each window used after the change, its
resistance against the plant's (the mean of the plant's over the window) and its drift against the
plant's (its resistance over the one the baseline was learned at); when the warning came, from
the change (fan-stop), or from when the plant's resistance passed +25 % (dust); and, for the
healthy board and the warm rooms, whether it ever came (a false alarm) and the highest drift.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quality
from mcpd.config import CoolingSection
from mcpd.events import Event, EventBus
from mcpd.governor import board
from mcpd.governor.loop import ControlLoop
from mcpd.sim import MEMORY_DIR, PROFILES, CoolingFault, LoadSchedule, Simulator
from mcpd.sim.faults import ambient_shift, resistance_factor

SCENARIOS = ("healthy", "fan-stop", "dust", "warm-room", "warm-afternoon")
WEAR = ("fan-stop", "dust")
LOAD = "bursts:90/60"
REFRESH_S = 1.0


@dataclass(frozen=True)
class Timeline:
    change_at_s: float = 3 * 3600.0 + 600.0
    hours: float = 11.0
    dust_s: float = 6 * 3600.0
    sample_s: float | None = None
    """The loop's sampling period for both signals; None: the daemon's defaults (0.2 s, 0.1 s)."""
    sustained_s: int = CoolingSection().sustained_s


def faults(scenario: str, timeline: Timeline) -> list[CoolingFault]:
    at = timeline.change_at_s
    return {
        "healthy": [],
        "fan-stop": [CoolingFault("fan-stop", 1.6, at)],
        "dust": [CoolingFault("dust", 1.5, at, timeline.dust_s)],
        "warm-room": [CoolingFault("ambient", 10.0, at)],
        "warm-afternoon": [CoolingFault("ambient", 10.0, at, 3 * 3600.0)],
    }[scenario]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(profile: str, scenario: str, timeline: Timeline = Timeline()) -> dict[str, object]:
    """One board through one scenario: every window used, when the warning came, and the plant's
    resistance beside them."""
    injected = faults(scenario, timeline)
    # bench/quality.py's settings: each board's power limit, the RK3588 NPU's coefficient.
    settings = replace(
        quality.loop_settings(quality.Case(profile, "bursts"), "hysteresis"),
        cooling=CoolingSection(sustained_s=timeline.sustained_s),
    )
    if timeline.sample_s is not None:
        settings = replace(settings, temperature_s=timeline.sample_s, power_s=timeline.sample_s)
    with tempfile.TemporaryDirectory(dir=MEMORY_DIR) as folder:
        sim = Simulator(
            PROFILES[profile],
            Path(folder) / "board",
            load=LoadSchedule.parse(LOAD),
            faults=injected,
        )
        sim.build()
        clock = _Clock()
        events = EventBus()
        said: list[tuple[float, Event]] = []
        events.subscribe(lambda e: said.append((clock.now, e)) if e.kind == "cooling" else None)
        loop = ControlLoop(
            sim.root, board.detect(sim.root), settings, events=events, baseline=None, clock=clock
        )
        loop.start()
        truth: list[tuple[float, float]] = []  # the plant's resistance and air, each second
        windows: list[dict[str, float]] = []
        wake, refresh_at = 0.0, 0.0
        while clock.now < timeline.hours * 3600:
            sim.advance(wake - clock.now)
            clock.now = wake
            wake = loop.tick(clock.now)
            if clock.now >= refresh_at:
                r_th = PROFILES[profile].thermal.r_th * resistance_factor(injected, sim.sim_s)
                truth.append((r_th, ambient_shift(injected, sim.sim_s)))
                used = loop.cooling.windows
                loop.cooling.refresh(clock.now)
                if loop.cooling.windows > used:
                    windows.append(_window(loop, truth))
                refresh_at += REFRESH_S
        status = loop.cooling.status()
    return _result(profile, scenario, timeline, windows, said, status.rejected)


def _window(loop: ControlLoop, truth: list[tuple[float, float]]) -> dict[str, float]:
    estimate = loop.cooling.health.recent[-1]
    plant = truth[int(estimate.start) : int(estimate.end)]
    return {
        "start_s": estimate.start,
        "end_s": estimate.end,
        "r_c_per_w": round(estimate.r_c_per_w, 4),
        "intercept_c": round(estimate.intercept_c, 2),
        "tau_s": round(estimate.tau_s, 1),
        "true_r_c_per_w": round(statistics.fmean(r for r, _ in plant), 4),
        "true_ambient_shift_c": round(statistics.fmean(c for _, c in plant), 2),
    }


def _result(
    profile: str,
    scenario: str,
    timeline: Timeline,
    windows: list[dict[str, float]],
    said: list[tuple[float, Event]],
    rejected: int,
) -> dict[str, object]:
    learned = [w for w in windows if w["end_s"] <= timeline.change_at_s][:4]
    result: dict[str, object] = {
        "profile": profile,
        "scenario": scenario,
        "windows": len(windows),
        "rejected": rejected,
        "events": [(round(t), e.data["change"]) for t, e in said],
    }
    if len(learned) < 4:
        return {**result, "baseline": None}
    base = statistics.median(w["r_c_per_w"] for w in learned)
    true_base = statistics.fmean(w["true_r_c_per_w"] for w in learned)
    after = [w for w in windows if w["start_s"] >= timeline.change_at_s]
    errors = [w["r_c_per_w"] / w["true_r_c_per_w"] - 1 for w in windows]
    drift_errors = [(w["r_c_per_w"] / base) / (w["true_r_c_per_w"] / true_base) - 1 for w in after]
    flagged = next((t for t, e in said if e.data["change"] == "degraded"), None)
    result.update(
        baseline_c_per_w=round(base, 3),
        true_c_per_w=round(true_base, 3),
        baseline_error=round(base / true_base - 1, 4),
        r_error_median=round(statistics.median(abs(e) for e in errors), 4),
        r_error_max=round(max(abs(e) for e in errors), 4),
        drift_error_median=round(statistics.median(abs(e) for e in drift_errors), 4)
        if drift_errors
        else None,
        drift_error_max=round(max(abs(e) for e in drift_errors), 4) if drift_errors else None,
        max_drift=round(max(w["r_c_per_w"] for w in after) / base, 3) if after else None,
        intercept_shift_c=round(
            statistics.median(w["intercept_c"] for w in after[-3:])
            - statistics.median(w["intercept_c"] for w in learned),
            2,
        )
        if after
        else None,
        true_ambient_shift_c=round(
            statistics.median(w["true_ambient_shift_c"] for w in after[-3:]), 2
        )
        if after
        else None,
        flagged_s=None if flagged is None else round(flagged),
        flagged_after_h=None
        if flagged is None
        else round((flagged - _onset(scenario, timeline)) / 3600, 2),
    )
    return result


def _onset(scenario: str, timeline: Timeline) -> float:
    """When the wear passes the warning (+25 %): at once for a stopped fan; for dust, when its
    linear rise to × 1.5 gets there."""
    if scenario == "dust":
        return timeline.change_at_s + timeline.dust_s * 0.25 / 0.5
    return timeline.change_at_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profiles", nargs="+", default=sorted(PROFILES))
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument(
        "--sample-s",
        type=float,
        help="the loop's sampling period for both signals (default: the daemon's 0.2 s and "
        "0.1 s; 1 s is ten times faster to run, as tests/governor/test_cooling.py does)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document per run")
    args = parser.parse_args()
    timeline = Timeline(sample_s=args.sample_s)
    cases = [(p, s, timeline) for p in args.profiles for s in args.scenarios]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run, *zip(*cases, strict=True)))
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(table(rows))


def table(rows: list[dict[str, object]]) -> str:
    """The runs as BENCHMARKS.md shows them (also from --json's lines, read back)."""
    lines = [
        "| profile | scenario | baseline °C/W (plant) | R error median/max | drift error median/max "
        "| highest drift | intercept shift °C (air) | warning after | windows used/not |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "baseline_c_per_w" not in r:
            used = f"{r['windows']}/{r['rejected']}"
            lines.append(f"| {r['profile']} | {r['scenario']} | no baseline | | | | | | {used} |")
            continue
        warned = "never" if r["flagged_after_h"] is None else f"{r['flagged_after_h']} h"
        drift = (
            "–"
            if r["drift_error_median"] is None
            else f"{r['drift_error_median']:.1%} / {r['drift_error_max']:.1%}"
        )
        lines.append(
            f"| {r['profile']} | {r['scenario']} | {r['baseline_c_per_w']} ({r['true_c_per_w']}) "
            f"| {r['r_error_median']:.1%} / {r['r_error_max']:.1%} | {drift} | {r['max_drift']} "
            f"| {r['intercept_shift_c']} ({r['true_ambient_shift_c']}) | {warned} "
            f"| {r['windows']}/{r['rejected']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
