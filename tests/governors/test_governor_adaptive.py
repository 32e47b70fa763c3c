"""The adaptive policy and its levels: pure, driven with readings and times."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from governors import (
    Action,
    AdaptivePolicy,
    AdaptiveState,
    DomainSteps,
    Level,
    Readings,
    allowed_mhz,
    stepped_levels,
    uniform_levels,
)
from governors.adaptive_state import learned
from governors.level_power import estimate_w
from governors.peaks import by_level

LEVELS = uniform_levels(
    [
        DomainSteps(
            "policy4", 2400.0, (800.0, 1008.0, 1200.0, 1416.0, 1608.0, 1800.0, 2016.0, 2400.0)
        ),
        DomainSteps("fdab0000.npu", 1000.0, (800.0, 900.0, 1000.0)),
    ]
)
TOP = len(LEVELS) - 1
POLICY = AdaptivePolicy()


def cool(temp_c: float = 60.0, power_w: float | None = None) -> Readings:
    return Readings(temp_c, power_w, metered=power_w is not None)


def feed(
    state: AdaptiveState, temps: list[float], start: float, step: float = 0.2
) -> AdaptiveState:
    for i, celsius in enumerate(temps):
        state = POLICY.observe(state, celsius, start + i * step)
    return state


def test_levels_are_every_distinct_uniform_cap_inside_the_range() -> None:
    fractions = [level.fraction for level in LEVELS]
    assert fractions == sorted(fractions) and len(set(fractions)) == len(fractions)
    assert LEVELS[0].caps_mhz == (("policy4", 800.0), ("fdab0000.npu", 800.0))
    assert LEVELS[-1].caps_mhz == (("policy4", 2400.0), ("fdab0000.npu", 1000.0))
    for lower, upper in itertools.pairwise(LEVELS):
        assert all(a <= b for (_, a), (_, b) in zip(lower.caps_mhz, upper.caps_mhz, strict=True))


def test_allowed_frequencies() -> None:
    assert allowed_mhz((408.0, 600.0, 816.0, 1008.0), 800.0, 1008.0) == (816.0, 1008.0)
    assert allowed_mhz((114.75, 216.75), 800.0, 3200.0) == (216.75,)  # nearest when none inside
    assert allowed_mhz((), 800.0, 1050.0) == (800.0, 900.0, 1000.0, 1050.0)  # intel_pstate grid


def test_unknown_temperature_cuts_like_the_seed_rule_every_decision() -> None:
    state = POLICY.start(LEVELS)
    verdict, state = POLICY.decide(state, Readings(None), 10.0, LEVELS)
    assert verdict.action is Action.LOWER and "fail-safe" in verdict.reason
    assert LEVELS[state.level].fraction <= 0.7 * LEVELS[TOP].fraction
    before = state.level
    verdict, state = POLICY.decide(state, Readings(None), 10.1, LEVELS)
    assert state.level < before
    for step in range(20):
        verdict, state = POLICY.decide(state, Readings(None), 10.2 + step / 10, LEVELS)
    assert state.level == 0 and verdict.action is Action.LOWER  # batches keep stepping down


def test_silent_meter_is_fail_safe_and_a_board_without_one_is_not() -> None:
    state = POLICY.start(LEVELS)
    verdict, _ = POLICY.decide(state, Readings(60.0, None, metered=True), 10.0, LEVELS)
    assert verdict.action is Action.LOWER and "meter silent" in verdict.reason
    verdict, _ = POLICY.decide(state, Readings(60.0, None, metered=False), 10.0, LEVELS)
    assert verdict.action is not Action.LOWER


def test_at_the_threshold_one_level_down_then_wait_for_it_to_act() -> None:
    state = POLICY.start(LEVELS)
    verdict, state = POLICY.decide(state, cool(85.0), 10.0, LEVELS)
    assert verdict.action is Action.LOWER and state.level == TOP - 1
    verdict, state = POLICY.decide(state, cool(85.2), 10.2, LEVELS)
    assert verdict.action is Action.HOLD and state.level == TOP - 1
    verdict, state = POLICY.decide(state, cool(85.2), 10.6, LEVELS)
    assert state.level == TOP - 2


def test_a_rising_temperature_lowers_before_the_threshold() -> None:
    state = feed(POLICY.start(LEVELS), [80.1 + 0.1 * i for i in range(20)], 0.0)  # 0.5 K/s
    verdict, state = POLICY.decide(state, cool(82.0), 4.0, LEVELS)
    assert verdict.action is Action.LOWER and "heading for" in verdict.reason
    flat = feed(POLICY.start(LEVELS), [82.0] * 20, 0.0)
    verdict, _ = POLICY.decide(flat, cool(82.0), 4.0, LEVELS)
    assert verdict.action is Action.HOLD  # at the top level and flat: nothing to do


def test_far_below_the_threshold_a_rise_is_left_to_run() -> None:
    """More than act_within_c below 85 °C a burst heats freely: the die and heatsink absorb it."""
    state = feed(POLICY.start(LEVELS), [78.1 + 0.1 * i for i in range(20)], 0.0)
    verdict, _ = POLICY.decide(state, cool(80.0), 4.0, LEVELS)
    assert verdict.action is Action.HOLD


def test_raises_one_level_at_a_time_and_backs_off_when_undone() -> None:
    state = feed(AdaptiveState(level=2, raise_interval_s=2.0), [70.0] * 20, 0.0)
    verdict, state = POLICY.decide(state, cool(70.0), 4.0, LEVELS)
    assert verdict.action is Action.RAISE and state.level == 3
    verdict, state = POLICY.decide(state, cool(70.0), 5.0, LEVELS)
    assert verdict.action is Action.HOLD  # not before raise_interval_s
    verdict, state = POLICY.decide(state, cool(85.0), 6.0, LEVELS)  # the raise is undone
    assert state.level == 2 and state.raise_interval_s == 4.0
    state = feed(state, [70.0] * 20, 6.2)
    verdict, state = POLICY.decide(state, cool(70.0), 9.0, LEVELS)
    assert verdict.action is Action.HOLD
    verdict, state = POLICY.decide(state, cool(70.0), 10.1, LEVELS)
    assert verdict.action is Action.RAISE
    state = feed(state, [70.0] * 20, 30.5)
    _, state = POLICY.decide(state, cool(70.0), 34.5, LEVELS)  # held 20 s: back-off halves
    assert state.raise_interval_s == 2.0


def test_back_off_is_bounded() -> None:
    state = AdaptiveState(level=3, raise_interval_s=60.0, raised_at=0.0)
    _, state = POLICY.decide(state, cool(85.0), 1.0, LEVELS)
    assert state.raise_interval_s == POLICY.max_raise_interval_s


def test_power_over_the_limit_jumps_to_a_level_estimated_under_it() -> None:
    state = POLICY.start(LEVELS)
    verdict, state = POLICY.decide(state, cool(60.0, 16.0), 1.0, LEVELS)
    assert verdict.action is Action.LOWER
    # Down, only the dynamic part scales: the estimate is the plain ratio, not its square.
    ratio = LEVELS[state.level].fraction / LEVELS[TOP].fraction
    assert 16.0 * ratio < 12.0 * POLICY.power_margin
    above = LEVELS[state.level + 1].fraction / LEVELS[TOP].fraction
    assert 16.0 * above >= 12.0 * POLICY.power_margin  # the highest such level
    level = state.level
    verdict, state = POLICY.decide(state, cool(60.0, 16.0), 1.2, LEVELS)  # meters lag: ignored
    assert state.level == level and verdict.action is Action.HOLD


def test_power_just_under_the_limit_lowers_before_it_is_crossed() -> None:
    state = POLICY.start(LEVELS)
    verdict, _ = POLICY.decide(state, cool(60.0, 11.95), 1.0, LEVELS)  # 0.995 x 12 W = 11.94
    assert verdict.action is Action.LOWER and "11.94 W" in verdict.reason
    verdict, _ = POLICY.decide(state, cool(60.0, 11.9), 1.0, LEVELS)
    assert verdict.action is not Action.LOWER


def test_learned_power_blocks_a_raise_the_limit_would_undo() -> None:
    state = feed(AdaptiveState(level=4, learned_w=((5, 12.5, 0.0),)), [60.0] * 20, 0.0)
    verdict, state = POLICY.decide(state, cool(60.0, 8.0), 10.0, LEVELS)
    assert verdict.action is Action.HOLD and "would draw ~12.5 W" in verdict.reason
    fresh = feed(AdaptiveState(level=4), [60.0] * 20, 0.0)  # scaled from 8 W: ~10 W
    verdict, _ = POLICY.decide(fresh, cool(60.0, 8.0), 10.0, LEVELS)
    assert verdict.action is Action.RAISE


def run(state: AdaptiveState, start: float, seconds: float, watts: float) -> AdaptiveState:
    """A decision every 100 ms (the meter's period) on `watts`."""
    for i in range(round(seconds * 10)):
        _, state = POLICY.decide(state, cool(60.0, watts), start + i / 10, LEVELS)
    return state


def test_no_wind_up_at_the_clamps() -> None:
    """Long spells at the top or the bottom leave nothing to unwind: one reading the other way
    moves at once."""
    state = feed(POLICY.start(LEVELS), [50.0] * 20, 0.0)
    for second in range(1, 300):
        _, state = POLICY.decide(state, cool(50.0), float(second), LEVELS)
    assert state.level == TOP
    verdict, state = POLICY.decide(state, cool(85.0), 301.0, LEVELS)
    assert verdict.action is Action.LOWER
    bottom = AdaptiveState(level=0)
    for second in range(300):
        _, bottom = POLICY.decide(bottom, cool(86.0), float(second), LEVELS)
    assert bottom.level == 0
    bottom = feed(bottom, [60.0] * 20, 300.0)
    verdict, bottom = POLICY.decide(bottom, cool(60.0), 305.0, LEVELS)
    assert verdict.action is Action.RAISE


@pytest.mark.parametrize("temps", [[], [70.0], [70.0, 71.0]])
def test_prediction_needs_three_samples_for_a_slope(temps: list[float]) -> None:
    state = feed(POLICY.start(LEVELS), temps, 0.0)
    assert POLICY.predicted_c(state) == (temps[-1] if temps else None)


def test_an_estimated_power_is_held_further_below_the_limit() -> None:
    """The estimate reads up to estimate_error low (docs/power-estimate.md): the same 11.5 W
    that a meter may run at is too close to 12 W when it is an estimate."""
    state = POLICY.start(LEVELS)
    metered = Readings(60.0, 11.5, metered=True)
    verdict, _ = POLICY.decide(state, metered, 1.0, LEVELS)
    assert verdict.action is not Action.LOWER
    estimated = Readings(60.0, 11.5, metered=True, power_estimated=True)
    verdict, _ = POLICY.decide(state, estimated, 1.0, LEVELS)
    limit = 12.0 / (1 + POLICY.estimate_error) * POLICY.power_trigger
    assert verdict.action is Action.LOWER and f"{limit:.2f} W" in verdict.reason
    assert "x the limit / 1.05, estimated" in verdict.reason


def with_full_load(watts: list[float]) -> tuple[Level, ...]:
    return tuple(replace(level, full_load_w=w) for level, w in zip(LEVELS, watts, strict=True))


def test_an_energy_model_forecast_decides_raises_whatever_the_load_is_now() -> None:
    """At idle the board draws little at any level; the forecast at full load keeps it at a
    level the next burst will not take over the limit, and lets it up to the last one that fits."""
    limit = 12.0 / (1 + POLICY.estimate_error) * POLICY.power_margin  # 11.09 W
    watts = [8.0 + 0.5 * i for i in range(len(LEVELS))]
    levels = with_full_load(watts)
    fits = max(i for i, w in enumerate(watts) if w < limit)
    state = feed(AdaptiveState(level=fits - 1), [50.0] * 20, 0.0)
    idle = Readings(50.0, 5.0, metered=True, power_estimated=True)
    verdict, state = POLICY.decide(state, idle, 10.0, levels)
    assert verdict.action is Action.RAISE and state.level == fits
    state = feed(state, [50.0] * 20, 10.0)
    verdict, state = POLICY.decide(state, idle, 20.0, levels)
    assert verdict.action is Action.HOLD and f"~{watts[fits + 1]:.1f} W" in verdict.reason
    # Over the limit at the top: straight down to the level that fits, not a guess by ratio.
    top = POLICY.start(levels)
    hot = Readings(60.0, 14.0, metered=True, power_estimated=True)
    verdict, top = POLICY.decide(top, hot, 1.0, levels)
    assert verdict.action is Action.LOWER and top.level == fits


def test_a_levels_peak_is_kept_through_idle_spells() -> None:
    """A burst's power at a level is what decides a raise there, not the idle power measured
    since: raising at idle into a level the next burst takes over the limit is what made the
    metered boards cross it at every burst start."""
    state = feed(AdaptiveState(level=4), [60.0] * 20, 0.0)
    state = run(state, 10.0, 1.0, 11.0)  # a burst at level 4
    state = run(state, 11.0, 1.0, 5.0)  # then idle
    assert learned(state)[4] == 11.0
    # Level 5 never visited: scaled from level 4's peak (11 W x ratio^2), not from 5 W now.
    expected = 11.0 * (LEVELS[5].fraction / LEVELS[4].fraction) ** 2
    assert estimate_w(state, LEVELS, 5, 5.0) == pytest.approx(expected)
    verdict, _ = POLICY.decide(state, cool(60.0, 5.0), 20.0, LEVELS)
    assert expected >= 12.0 * POLICY.power_margin
    assert verdict.action is Action.HOLD and "next level would draw" in verdict.reason


def test_a_power_reading_is_learned_once_however_many_decisions_see_it() -> None:
    """Power read less often than temperature (`power_ms` above `temperature_ms`): several
    decisions see one reading, and it is one reading of the peak's window: a spike read once is
    no peak however many decisions see it (issue 28). Counted at each, it was."""
    state = run(AdaptiveState(level=TOP), 10.0, 1.0, 8.0)
    spike = Readings(60.0, 11.5, metered=True, power_at=11.0)
    for now in (11.0, 11.2, 11.4, 11.6, 11.8):
        _, state = POLICY.decide(state, spike, now, LEVELS)
    assert learned(state)[TOP] == 8.0


def governed(
    state: AdaptiveState, start: float, seconds: float, watts: Callable[[int, float], float]
) -> tuple[AdaptiveState, list[tuple[float, int]]]:
    """A board at 60 °C whose power is `watts(level, now)`, decided on every 100 ms; returns
    the state and (time, level) after each decision."""
    levels = []
    for i in range(round(seconds * 10)):
        now = start + i / 10
        state = POLICY.observe(state, 60.0, now)
        _, state = POLICY.decide(state, cool(60.0, watts(state.level, now)), now, LEVELS)
        levels.append((now, state.level))
    return state, levels


def load(top_w: float) -> Callable[[int], float]:
    """What the board draws at each level under a load that draws `top_w` at the top."""
    return lambda level: top_w * (LEVELS[level].fraction / LEVELS[TOP].fraction) ** 2


def test_a_spike_cuts_but_is_no_peak_and_the_board_comes_back() -> None:
    """Issue 26: 8 W at the top of a 12 W limit, then one 250 ms spike to 14 W. The spike cuts
    (the limit is held as the meter reads it), but it is not the top level's peak: the board is
    back at the top as fast as the raise budget allows. Before, the spike was the top's peak for
    good and the board never went back."""
    usual = load(8.0)

    def spiky(level: int, now: float) -> float:
        return 14.0 if 30.0 <= now < 30.25 else usual(level)

    state, levels = governed(POLICY.start(LEVELS), 0.0, 120.0, spiky)
    assert [level for t, level in levels if t < 30.0] == [TOP] * 300
    cut = next(level for t, level in levels if t >= 30.0)
    assert cut < TOP
    assert learned(state)[TOP] == 8.0
    back = next(t for t, level in levels if t > 30.0 and level == TOP)
    # Three uniform levels up, at most two raises a minute: back 62 s after the spike.
    assert back < 95.0 and all(level == TOP for t, level in levels if t >= back)


def test_a_load_that_rose_is_the_peak_of_the_level_it_cut_from() -> None:
    """The same cut for a load that stays: at lower caps the board draws more than the top's
    peak did, so the reading that cut was no spike and bars the top."""
    half, full = load(8.0), load(15.0)
    state, _ = governed(POLICY.start(LEVELS), 0.0, 30.0, lambda level, _: half(level))
    state, levels = governed(state, 30.0, 60.0, lambda level, _: full(level))
    assert learned(state)[TOP] == 15.0
    assert all(level < TOP for _, level in levels)


def test_a_peak_not_reached_again_for_ten_minutes_is_forgotten() -> None:
    """A level left for good (a load gone, a hot afternoon) is not barred for good: its peak is
    forgotten 600 s after it was last reached, and the level is estimated from below again."""
    state = AdaptiveState(level=4, learned_w=((5, 12.5, 0.0),))
    verdict, _ = POLICY.decide(feed(state, [60.0] * 20, 596.0), cool(60.0, 8.0), 599.9, LEVELS)
    assert verdict.action is Action.HOLD and "would draw ~12.5 W" in verdict.reason
    verdict, _ = POLICY.decide(feed(state, [60.0] * 20, 596.0), cool(60.0, 8.0), 600.0, LEVELS)
    assert verdict.action is Action.RAISE
    # Reached again, a peak lives on from then.
    state = AdaptiveState(level=4, learned_w=((4, 11.0, 0.0),))
    state = run(state, 500.0, 1.0, 11.0)
    assert by_level(POLICY.peaks.expire(state.learned_w, 1000.0)) == {4: 11.0}


STEPPED = stepped_levels(
    [
        DomainSteps("policy0", 2100.0, (1400.0, 1700.0, 2100.0)),
        DomainSteps("policy1", 2100.0, (1400.0, 1700.0, 2100.0)),
        DomainSteps("policy2", 2100.0, (1400.0, 1700.0, 2100.0)),
    ]
)


def test_stepped_levels_raise_one_domain_at_a_time_between_the_uniform_ones() -> None:
    caps = [tuple(mhz for _, mhz in level.caps_mhz) for level in STEPPED]
    assert caps == [
        (1400.0, 1400.0, 1400.0),
        (1700.0, 1400.0, 1400.0),
        (1700.0, 1700.0, 1400.0),
        (1700.0, 1700.0, 1700.0),
        (2100.0, 1700.0, 1700.0),
        (2100.0, 2100.0, 1700.0),
        (2100.0, 2100.0, 2100.0),
    ]
    assert [level.uniform for level in STEPPED] == [True, False, False, True, False, False, True]
    assert tuple(level for level in STEPPED if level.uniform) == uniform_levels(
        [DomainSteps(f"policy{i}", 2100.0, (1400.0, 1700.0, 2100.0)) for i in range(3)]
    )
    fractions = [level.fraction for level in STEPPED]
    assert fractions == sorted(fractions) and len(set(fractions)) == len(fractions)


def test_a_power_limit_between_two_uniform_levels_is_held_by_a_mix_of_them() -> None:
    # 10 W with every core at 1700 MHz, each core at 2100 adds 1 W: 11 W fits under 12 W, 12 W
    # does not. Measured peaks per level (what the board showed there).
    learned = ((3, 10.0, 98.0), (4, 11.0, 98.0), (5, 12.0, 98.0))
    state = feed(replace(POLICY.start(STEPPED), level=3, learned_w=learned), [60.0] * 10, 98.0)
    verdict, state = POLICY.decide(state, cool(60.0, 10.0), 100.0, STEPPED)
    assert verdict.action is Action.RAISE and state.level == 4
    state = feed(state, [60.0] * 10, 198.0)
    verdict, state = POLICY.decide(state, cool(60.0, 11.0), 200.0, STEPPED)
    assert verdict.action is Action.HOLD and state.level == 4 and "12.0 W" in verdict.reason


def test_heat_at_the_threshold_moves_every_domain_down_from_an_in_between_level() -> None:
    state = replace(POLICY.start(STEPPED), level=5)
    verdict, state = POLICY.decide(state, cool(85.5), 100.0, STEPPED)
    assert verdict.action is Action.LOWER and state.level == 3  # every core at 1700 MHz


def test_the_fail_safe_lands_on_a_uniform_level_every_domain_cut() -> None:
    levels = stepped_levels(
        [
            DomainSteps("policy4", 2400.0, (800.0, 1008.0, 1200.0, 1416.0, 1608.0, 2400.0)),
            DomainSteps("gpu", 1000.0, (300.0, 500.0, 700.0, 800.0, 1000.0)),
        ]
    )
    for start in range(len(levels)):
        _, state = POLICY.decide(
            replace(POLICY.start(levels), level=start), Readings(None), 10.0, levels
        )
        assert levels[state.level].uniform
        limit = levels[start].fraction * POLICY.params.down_factor
        assert all(
            mhz <= limit * top + 1e-6 or mhz == lowest
            for (_, mhz), top, lowest in zip(
                levels[state.level].caps_mhz, (2400.0, 1000.0), (800.0, 300.0), strict=True
            )
        )


def test_far_below_the_threshold_a_raise_takes_a_whole_uniform_level() -> None:
    state = feed(POLICY.start(STEPPED), [50.0] * 10, 0.0)
    state = replace(state, level=0)
    verdict, state = POLICY.decide(state, cool(50.0), 10.0, STEPPED)
    assert verdict.action is Action.RAISE and state.level == 3
    near = feed(replace(POLICY.start(STEPPED), level=0), [82.0] * 10, 0.0)
    verdict, near = POLICY.decide(near, cool(82.0), 10.0, STEPPED)
    assert verdict.action is Action.RAISE and near.level == 1


def test_raises_are_limited_per_minute() -> None:
    state = replace(POLICY.start(LEVELS), level=0)
    raises = []
    for step in range(600):  # a minute, every 0.1 s, always cool: it would raise every 2 s
        now = 10.0 + step / 10
        state = POLICY.observe(state, 60.0, now)
        verdict, state = POLICY.decide(state, cool(60.0), now, LEVELS)
        raises += [now] if verdict.action is Action.RAISE else []
    assert len(raises) == POLICY.max_raises_per_min
    verdict, state = POLICY.decide(state, cool(60.0), raises[0] + 60.0, LEVELS)
    assert verdict.action is Action.RAISE
