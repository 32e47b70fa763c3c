"""The hysteresis governor, driven by tables of readings including the exact boundaries."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governors import Action, GovernorParams, HysteresisGovernor, RaiseHold, Readings, Verdict

G = HysteresisGovernor()


def target_mhz(
    governor: HysteresisGovernor, temp: float | None, power: float | None, current: float
) -> float:
    """The seed rule on one frequency: power None means the board has no meter."""
    verdict = governor.verdict(Readings(temp, power, metered=power is not None))
    return governor.step_mhz(verdict, current).new


def target_batch(temp: float | None, power: float | None, batch: int, max_batch: int) -> int:
    verdict = G.verdict(Readings(temp, power, metered=power is not None))
    return int(G.step_batch(verdict, batch, max_batch).new)


@pytest.mark.parametrize(
    ("temp", "power", "current", "expected"),
    [
        # lower: temperature or power at/over the high threshold
        (85.0, 5.0, 2000.0, 1400.0),
        (84.999, 12.0, 2000.0, 1400.0),
        (100.0, 20.0, 2000.0, 1400.0),
        (85.0, None, 2000.0, 1400.0),
        (90.0, 5.0, 1000.0, 800.0),  # floor
        (90.0, 5.0, 800.0, 800.0),
        (None, 5.0, 2000.0, 1400.0),  # unknown temperature is hot
        (None, None, 2000.0, 1400.0),
        # raise: both at/under the low thresholds
        (75.0, 9.0, 2000.0, 2300.0),
        (40.0, None, 2000.0, 2300.0),  # no meter: temperature decides
        (40.0, 1.0, 3000.0, 3200.0),  # ceiling
        (40.0, 1.0, 3200.0, 3200.0),
        # hold: inside the band on either signal
        (75.001, 9.0, 2000.0, 2000.0),
        (84.999, 11.999, 2000.0, 2000.0),
        (70.0, 9.001, 2000.0, 2000.0),
        (80.0, None, 2000.0, 2000.0),
        (75.0, 11.0, 2000.0, 2000.0),
    ],
)
def test_target_mhz_table(
    temp: float | None, power: float | None, current: float, expected: float
) -> None:
    assert target_mhz(G, temp, power, current) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("temp", "power", "batch", "max_batch", "expected"),
    [
        (85.0, 1.0, 10, 16, 7),  # floor(7.0)
        (85.0, 1.0, 3, 16, 2),  # floor(2.1)
        (85.0, 1.0, 1, 16, 1),  # at least 1
        (None, 1.0, 8, 16, 5),
        (12.0, 12.0, 8, 16, 5),
        (75.0, 9.0, 10, 16, 12),  # ceil(11.5)
        (75.0, 9.0, 1, 16, 2),  # ceil(1.15)
        (75.0, 9.0, 15, 16, 16),  # at most max_batch
        (80.0, 9.0, 10, 16, 10),
    ],
)
def test_target_batch_table(
    temp: float | None, power: float | None, batch: int, max_batch: int, expected: int
) -> None:
    assert target_batch(temp, power, batch, max_batch) == expected


def test_silent_meter_is_fail_safe_but_no_meter_is_not() -> None:
    cool = 50.0
    assert G.verdict(Readings(cool, None, metered=True)) == Verdict(
        Action.LOWER, "power unknown, meter silent (fail-safe)"
    )
    assert G.verdict(Readings(cool, None, metered=False)).action is Action.RAISE


def test_decisions_say_what_and_why() -> None:
    decision = G.step_mhz(G.verdict(Readings(86.04, 7.5, True)), 2000.0)
    assert (decision.action, decision.old, decision.new, decision.changed) == (
        Action.LOWER,
        2000.0,
        1400.0,
        True,
    )
    assert decision.reason == "temperature 86.0 °C >= 85 °C"
    assert G.verdict(Readings(60.0, 12.5, True)).reason == "power 12.50 W >= 12 W"
    assert (
        G.verdict(Readings(60.0, 8.0, True)).reason
        == "temperature 60.0 °C <= 75 °C and power 8.00 W <= 9 W"
    )
    hold = G.step_mhz(G.verdict(Readings(80.0, 8.0, True)), 2000.0)
    assert (hold.action, hold.changed, hold.reason) == (
        Action.HOLD,
        False,
        "inside the hysteresis band",
    )


def test_per_domain_clamp() -> None:
    verdict = G.verdict(Readings(90.0))
    assert G.step_mhz(verdict, 500.0, min_mhz=115.2, max_mhz=1510.4).new == pytest.approx(350.0)
    assert G.step_mhz(verdict, 150.0, min_mhz=115.2, max_mhz=1510.4).new == pytest.approx(115.2)
    up = G.verdict(Readings(40.0))
    assert G.step_mhz(up, 1500.0, min_mhz=115.2, max_mhz=1510.4).new == pytest.approx(1510.4)


def test_overrides_and_invalid_settings() -> None:
    governor = HysteresisGovernor(
        GovernorParams(
            temp_high_c=70.0,
            temp_low_c=60.0,
            power_high_w=30.0,
            power_low_w=20.0,
            down_factor=0.5,
            up_factor=2.0,
            min_mhz=100.0,
            max_mhz=5000.0,
        )
    )
    assert target_mhz(governor, 70.0, 1.0, 1000.0) == 500.0
    assert target_mhz(governor, 60.0, 20.0, 1000.0) == 2000.0
    assert target_mhz(governor, 65.0, 1.0, 1000.0) == 1000.0
    for bad in (
        {"temp_low_c": 90.0},
        {"power_low_w": 12.0},
        {"down_factor": 1.0},
        {"up_factor": 1.0},
        {"min_mhz": 4000.0},
        {"min_mhz": 0.0},
    ):
        with pytest.raises(ValueError, match=r"must|need"):
            GovernorParams(**bad)


finite = st.floats(min_value=-40, max_value=150, allow_nan=False)
watts = st.one_of(st.none(), st.floats(min_value=0, max_value=100, allow_nan=False))


@given(
    temp=st.one_of(st.none(), finite), power=watts, current=st.floats(min_value=800, max_value=3200)
)
def test_target_always_within_range_and_moves_the_right_way(
    temp: float | None, power: float | None, current: float
) -> None:
    new = target_mhz(G, temp, power, current)
    assert 800.0 <= new <= 3200.0
    hot = temp is None or temp >= 85 or (power is not None and power >= 12)
    cool = temp is not None and temp <= 75 and (power is None or power <= 9)
    if hot:
        assert new <= current
    elif cool:
        assert new >= current
    else:
        assert new == current


@given(
    temp=st.one_of(st.none(), finite),
    power=watts,
    batch=st.integers(1, 64),
    max_batch=st.integers(1, 64),
)
def test_batch_always_within_range(
    temp: float | None, power: float | None, batch: int, max_batch: int
) -> None:
    batch = min(batch, max_batch)
    new = target_batch(temp, power, batch, max_batch)
    assert 1 <= new <= max_batch


def test_lowering_reaches_the_floor_and_raising_climbs_back() -> None:
    mhz = 3200.0
    steps_down = 0
    while mhz > 800.0:
        mhz = target_mhz(G, 90.0, None, mhz)
        steps_down += 1
    assert steps_down == math.ceil(math.log(800 / 3200) / math.log(0.7))
    steps_up = 0
    while mhz < 3200.0:
        mhz = target_mhz(G, 50.0, None, mhz)
        steps_up += 1
    assert steps_up == math.ceil(math.log(3200 / 800) / math.log(1.15))


def test_raise_hold_delays_each_raise() -> None:
    raise_ = G.verdict(Readings(50.0))
    lower = G.verdict(Readings(90.0))
    hold = RaiseHold(2.0)
    verdict, hold = hold.apply(raise_, 10.0)
    assert verdict.action is Action.HOLD and "raise held: 0.0 s of 2 s" in verdict.reason
    verdict, hold = hold.apply(raise_, 11.9)
    assert verdict.action is Action.HOLD
    verdict, hold = hold.apply(raise_, 12.0)
    assert verdict.action is Action.RAISE
    verdict, hold = hold.apply(raise_, 13.0)  # the timer restarts after each raise
    assert verdict.action is Action.HOLD
    verdict, hold = hold.apply(lower, 13.5)  # lowering is never delayed, and resets the timer
    assert verdict.action is Action.LOWER
    verdict, hold = hold.apply(raise_, 15.0)
    assert verdict.action is Action.HOLD
    verdict, _ = RaiseHold(0.0).apply(raise_, 0.0)
    assert verdict.action is Action.RAISE
