"""`thermal.seconds_to_throttle`: the fitted two-mass model, and its forecast against the
simulator's actual time to 85 °C."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.throttle_forecast import run
from mcpd import config
from mcpd.governor.daemon import Daemon
from mcpd.governor.thermal_forecast import (
    MIN_HISTORY_S,
    ThrottleForecast,
    leakage,
    seconds_to_threshold,
    stable,
)
from mcpd.sim import PROFILES, Simulator
from tests.support.fakesys import FakeSysfs
from tests.support.loop import board_with_meter, make_loop, run_for, set_power, set_temp


def two_masses(powers: list[float], ambient: float = 25.0) -> list[float]:
    """1 s samples of a die (τ 3 s, 1.5 K/W) over a heatsink (τ 40 s, 4.5 K/W), solved exactly
    per second: the physics the model is meant to fit, with its own numbers."""
    die = sink = ambient + 6.0 * powers[0]
    temps = []
    for watts in powers:
        sink_target = ambient + 4.5 * watts
        sink_next = sink_target + (sink - sink_target) * math.exp(-1 / 40)
        die_target = sink + 1.5 * watts
        die = die_target + (die - die_target) * math.exp(-1 / 3)
        sink = sink_next
        temps.append(die)
    return temps


def actual_crossing(temps: list[float], threshold: float) -> float:
    k = next(i for i, t in enumerate(temps) if t >= threshold)
    return k - 1 + (threshold - temps[k - 1]) / (temps[k] - temps[k - 1])


def test_forecast_of_a_load_step_from_its_own_history() -> None:
    # Idle 2 W for 90 s, 10 W for 60 s, idle 60 s, then 10 W again: forecast 20 s into it.
    powers = [2.0] * 90 + [10.0] * 60 + [2.0] * 60 + [10.0] * 300
    temps = two_masses(powers)
    actual = actual_crossing(temps[230:], 75.0)  # 85 °C is never reached at 10 W: 25 + 60 K
    forecast = seconds_to_threshold(temps[:231], powers[:231], 75.0)
    assert actual > 10 and forecast == pytest.approx(actual, rel=0.05)


def test_no_forecast_when_cooling_levelling_off_or_already_there() -> None:
    powers = [2.0] * 90 + [10.0] * 60 + [2.0] * 60
    temps = two_masses(powers)
    assert seconds_to_threshold(temps, powers, 75.0) is None  # cooling after the load
    steady = two_masses([2.0] * 60 + [6.0] * 200)
    assert 60.0 < steady[-1] < 61.0  # still rising, towards 61 °C
    assert seconds_to_threshold(steady, [2.0] * 60 + [6.0] * 200, 65.0) is None  # levels off below
    assert seconds_to_threshold(temps[:150], powers[:150], temps[140]) == 0.0
    assert seconds_to_threshold(temps[: MIN_HISTORY_S - 1], powers, 75.0) is None
    # A board at rest for its whole history taught the model nothing: no forecast.
    assert seconds_to_threshold([40.0] * 120, [2.0] * 120, 85.0) is None


def test_leakage_is_the_power_growth_per_kelvin_since_the_last_step() -> None:
    temps = [40.0] * 20 + [50.0 + i for i in range(30)]
    powers = [3.0] * 20 + [10.0 + 0.02 * (t - 50.0) for t in temps[20:]]
    assert leakage(temps, powers) == pytest.approx(0.02)
    assert leakage(temps[:25], powers[:25]) == 0.0  # too short and too little rise to tell
    falling = [10.0 - 0.02 * (t - 50.0) for t in temps[20:]]
    assert leakage(temps, [3.0] * 20 + falling) == 0.0  # never negative
    steep = [10.0 + 1.0 * (t - 50.0) for t in temps[20:]]  # more than ever came from leakage
    assert leakage(temps[:40], [3.0] * 20 + steep[:20]) == pytest.approx(
        0.01 * 19.5
    )  # 1 % of the mean power


def test_two_relaxing_masses_are_stable_an_oscillation_is_not() -> None:
    fast, slow = math.exp(-1 / 3), math.exp(-1 / 40)
    assert stable(fast + slow, -fast * slow)
    assert not stable(1.9, -1.0)  # complex roots
    assert not stable(1.2, -0.1)  # a root above 1: runaway


def test_forecast_is_refreshed_once_a_second() -> None:
    forecast = ThrottleForecast()
    powers = [2.0] * 90 + [10.0] * 60 + [2.0] * 60 + [10.0] * 20
    for second, (temp, watts) in enumerate(zip(two_masses(powers), powers, strict=True)):
        forecast.add(float(second), temp)
        forecast.add_power(float(second), watts)
    first = forecast.seconds_to(75.0, 229.0)
    assert first is not None and first > 10
    forecast.add(229.5, 90.0)  # a reading that would change it, within the same second
    assert forecast.seconds_to(75.0, 229.5) == first
    assert forecast.seconds_to(75.0, 230.0) == 0.0


def test_the_loop_feeds_the_forecast(fake: FakeSysfs) -> None:
    """The control loop's samples reach the model: on a board whose temperature follows two
    masses under a load step (written second by second, the governor paused so that nothing else
    moves), the loop's forecast matches when that curve reaches 85 °C."""
    powers = [2.0] * 30 + [11.5] * 40 + [2.0] * 30 + [11.5] * 200
    temps = two_masses(powers)
    board_with_meter(fake, temps[0], powers[0])
    loop, clock, _ = make_loop(fake.root)
    loop.paused = True
    for second in range(115):  # the curve between its seconds, as a sensor sees it
        set_power(fake, powers[second + 1])
        for fifth in range(5):
            set_temp(fake, temps[second] + (temps[second + 1] - temps[second]) * fifth / 5)
            run_for(loop, clock, 0.2)
    actual = actual_crossing(temps[115:], 85.0)
    assert loop.forecast.seconds_to(85.0, clock.now) == pytest.approx(actual, rel=0.1)


def test_the_daemons_status_carries_the_forecast(tmp_path: Path) -> None:
    """The status path asks the loop's forecaster (off the loop's thread) at the threshold in
    force, and the document carries the answer."""
    sim = Simulator(PROFILES["rk3588"], tmp_path / "board")
    sim.build()
    daemon = Daemon(lambda: config.parse({"daemon": {
        "sysfs_root": str(sim.root), "state_dir": str(tmp_path / "state"),
        "runtime_dir": str(tmp_path / "run"), "socket": str(tmp_path / "mcpd.sock")}}))  # fmt: skip
    asked: list[float] = []

    def seconds_to(threshold_c: float, now: float) -> float:
        asked.append(threshold_c)
        return 12.34

    daemon.loop.forecast.seconds_to = seconds_to  # type: ignore[method-assign]
    assert daemon.status()["thermal"]["seconds_to_throttle"] == 12.3
    assert asked == [85.0]


@pytest.mark.slow
def test_seconds_to_throttle_against_the_simulator() -> None:
    """bench/throttle_forecast.py's case: a simulated RK3588 (power from its estimate) under
    90 s of load, 120 s idle, then load again; every forecast more than 10 s before the board
    reaches 85 °C is within 20 % of when it did."""
    result = run("rk3588", 1.0, 25.0)
    assert result["crossed_s"] is not None and result["crossed_s"] > 20
    assert result["max_error"] is not None and result["max_error"] <= 0.2
    assert result["missed"] <= 3  # the first seconds of the load: the means straddle the step
