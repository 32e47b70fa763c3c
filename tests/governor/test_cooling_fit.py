"""The cooling fit and its pure parts: the two-mass model fitted to one window, the rule that says
which windows to use, the windows gathered from the loop's readings, and the health's state."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from mcpd.config import CoolingSection
from mcpd.governor.cooling_fit import STEP_S, assess, fit
from mcpd.governor.cooling_health import Estimate, Health, figures, step
from mcpd.governor.cooling_windows import WINDOW_S, WINDOW_STEPS, WindowCollector

WINDOW = int(WINDOW_S)


def bursts(second: float) -> float:
    """2 W idle, 10 W busy: 90 s on, 60 s off."""
    return 10.0 if second % 150 < 90 else 2.0


def board(
    power: Callable[[float], float],
    *,
    r: float = 6.0,
    tau_s: float = 40.0,
    ambient: Callable[[float], float] = lambda t: 25.0,
    noise_c: float = 0.0,
    seconds: int = WINDOW,
) -> tuple[list[float], list[float]]:
    """STEP_S means of a die (a quarter of R, τ 3 s) over a heatsink (the rest, τ `tau_s`),
    each solved exactly every 0.1 s: the physics the model is meant to fit, with numbers of its
    own; `noise_c` of sensor noise on each reading."""
    rng = random.Random(1)
    dt = 0.1
    sink = ambient(0.0) + 0.75 * r * power(0.0)
    die = sink + 0.25 * r * power(0.0)
    temps, powers, t_sum, p_sum = [], [], 0.0, 0.0
    per_step = round(STEP_S / dt)
    for tick in range(round(seconds / dt)):
        t = tick * dt
        watts = power(t)
        sink_next = ambient(t) + 0.75 * r * watts
        sink_next += (sink - sink_next) * math.exp(-dt / tau_s)
        die_target = sink + 0.25 * r * watts
        die = die_target + (die - die_target) * math.exp(-dt / 3.0)
        sink = sink_next
        t_sum += die + rng.gauss(0.0, noise_c)
        p_sum += watts
        if (tick + 1) % per_step == 0:
            temps.append(t_sum / per_step)
            powers.append(p_sum / per_step)
            t_sum = p_sum = 0.0
    return temps, powers


def test_the_two_mass_model_finds_the_resistance_and_time_constant_of_two_masses() -> None:
    temps, powers = board(bursts)
    fitted = fit(temps, powers)
    assert fitted is not None and assess(powers, fitted) is None
    assert fitted.r_c_per_w == pytest.approx(6.0, rel=0.01)
    assert fitted.tau_s == pytest.approx(40.0, rel=0.1)
    assert fitted.fast_tau_s == pytest.approx(3.0, rel=0.25)
    assert fitted.intercept_c == pytest.approx(25.0, abs=0.5)
    assert fitted.rms_c < 0.1


def test_sensor_noise_does_not_bias_the_resistance() -> None:
    """An output-error fit: noise on the temperature costs precision, not accuracy (a regression
    on the temperature's own past, mcpd.governor.thermal_forecast's, read the simulated Orin
    Nano's 6.4 °C/W as 5.6, at a sixth of this noise)."""
    temps, powers = board(bursts, noise_c=1.0)
    fitted = fit(temps, powers)
    assert fitted is not None and assess(powers, fitted) is None
    assert fitted.r_c_per_w == pytest.approx(6.0, rel=0.02)


def test_a_warm_room_moves_the_intercept_wear_moves_the_resistance() -> None:
    cool = fit(*board(bursts))
    warm = fit(*board(bursts, ambient=lambda t: 35.0))
    worn = fit(*board(bursts, r=7.5))
    assert cool is not None and warm is not None and worn is not None
    assert warm.r_c_per_w == pytest.approx(cool.r_c_per_w, rel=0.005)
    assert warm.intercept_c - cool.intercept_c == pytest.approx(10.0, abs=0.2)
    assert worn.r_c_per_w / cool.r_c_per_w == pytest.approx(1.25, rel=0.01)
    assert worn.intercept_c == pytest.approx(cool.intercept_c, abs=0.5)


def test_a_steady_power_says_nothing() -> None:
    temps, powers = board(lambda t: 6.0 + 0.1 * (t % 150 < 90))
    assert assess(powers, fit(temps, powers)) == "power too steady (0.8% spread, 5% needed)"


def test_a_window_the_air_changed_in_is_not_used() -> None:
    temps, powers = board(bursts, ambient=lambda t: 25.0 if t < 900 else 35.0)
    why = assess(powers, fit(temps, powers))
    assert why is not None and "the air or the cooling changed" in why


def test_a_time_constant_the_window_cannot_tell_is_not_used() -> None:
    temps, powers = board(lambda t: 10.0 if t % 3600 < 1200 else 2.0, tau_s=1500.0)
    why = assess(powers, fit(temps, powers))
    assert why is not None and "longer than a window can tell" in why


def test_the_collector_makes_windows_of_unbroken_steps() -> None:
    collector = WindowCollector()
    collector.begin("board-a")

    def feed(start: float, seconds: float) -> None:
        for tenth in range(round(seconds * 10)):
            t = start + tenth / 10
            collector.add_power(t, 5.0 + (t % 10))
            if tenth % 2 == 0:
                collector.add_temperature(t, 50.0)

    feed(0.0, WINDOW_S - 20)
    feed(WINDOW_S, 10)  # 20 s without a reading: the window breaks
    assert collector.take() == []
    feed(WINDOW_S + 10, WINDOW_S + 10)
    (window,) = collector.take()
    assert (window.board, window.start, window.end) == ("board-a", WINDOW_S, 2 * WINDOW_S)
    assert len(window.temps) == len(window.powers) == WINDOW_STEPS
    assert window.temps[0] == 50.0 and window.powers[0] == pytest.approx(7.45)  # 5 + 0.0..4.9
    assert collector.take() == []
    feed(2 * WINDOW_S + 10, 1000)
    collector.begin("board-b")  # sensors found again differently: what was gathered is dropped
    feed(2 * WINDOW_S + 1010, WINDOW_S + 10)
    (window,) = collector.take()
    assert (window.board, window.start) == ("board-b", 2 * WINDOW_S + 1010)


SETTINGS = CoolingSection(drift_warning=1.25, sustained_s=7200)


def windows(health: Health, rs: list[float], start: float = 0.0) -> tuple[Health, list[str]]:
    """`rs` as back-to-back half-hour windows from `start`; what changed, by window."""
    changes = []
    for i, r in enumerate(rs):
        estimate = Estimate(start + i * WINDOW_S, start + (i + 1) * WINDOW_S, r, 40.0, 20.0)
        health, change = step(health, estimate, SETTINGS)
        changes.append(change or "")
    return health, changes


def test_a_baseline_from_the_first_windows_then_wear_sustained_for_hours() -> None:
    health, changes = windows(Health(), [6.0, 6.2, 5.9, 6.1])
    assert changes == ["", "", "", "baseline"] and health.state == "normal"
    assert health.baseline is not None and health.baseline.r_c_per_w == pytest.approx(6.05)
    # +25 % from the fifth window: rising, degraded once 2 h of windows say so (four of them).
    health, changes = windows(health, [7.6, 7.7, 7.6, 7.8, 7.9], start=4 * WINDOW_S)
    assert changes == ["", "", "", "degraded", ""]
    assert health.state == "degraded" and health.degraded_since == 4 * WINDOW_S
    # One window below is not enough to call it normal again, nor one above to undo that.
    health, changes = windows(health, [6.0, 7.8, 6.1, 6.0, 6.0, 6.1], start=9 * WINDOW_S)
    assert changes == ["", "", "", "", "", "recovered"] and health.state == "normal"


def test_a_window_below_breaks_a_rising_run() -> None:
    health, _ = windows(Health(), [6.0] * 4)
    health, changes = windows(health, [7.6, 7.6, 7.6, 6.0, 7.6, 7.6, 7.6], start=4 * WINDOW_S)
    assert set(changes) == {""} and health.state == "rising"
    assert figures(health, SETTINGS).since == 8 * WINDOW_S


def test_too_few_windows_are_not_sustained_however_long_apart() -> None:
    """Windows are evidence only where the power changed: two of them a day apart are still two."""
    health, _ = windows(Health(), [6.0] * 4)
    health, first = windows(health, [7.6], start=4 * WINDOW_S)
    health, second = windows(health, [7.6], start=50 * WINDOW_S)
    assert first == second == [""] and health.state == "rising"
    health, third = windows(health, [7.6], start=51 * WINDOW_S)
    assert third == ["degraded"]


def test_the_figures_are_the_median_of_the_last_windows_with_their_agreement() -> None:
    health, _ = windows(Health(), [6.0, 6.0, 6.0, 6.0, 6.3, 6.6, 6.45])
    got = figures(health, SETTINGS)
    assert got.now is not None and got.now.r_c_per_w == 6.45
    assert got.drift_ratio == pytest.approx(6.45 / 6.0)
    assert got.confidence == pytest.approx(1 - (0.3 / 6.45) / 0.25)
    one, _ = windows(Health(), [6.0])
    assert figures(one, SETTINGS).confidence == pytest.approx(1 / 3)
    assert figures(one, SETTINGS).drift_ratio is None
    assert figures(Health(), SETTINGS).now is None
