"""The control loop's parts, each on its own: start-up, sample ageing, re-discovery triggers,
governability, report wording and batch sizes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from governors import (
    Action,
    AdaptiveGovernor,
    GovernorParams,
    HysteresisGovernor,
    Readings,
    Verdict,
)
from mcpd.events import Event, EventBus
from mcpd.governor import board, reports
from mcpd.governor.actuation import CapChange, DomainControl
from mcpd.governor.baseline import Baseline
from mcpd.governor.decisions import BatchSizes, PolicyDriver
from mcpd.governor.domains import FrequencyDomain
from mcpd.governor.freshness import Freshness
from mcpd.governor.loop import ControlLoop
from mcpd.governor.loop_settings import LoopSettings
from mcpd.governor.rediscovery import Governability, RediscoveryTrigger
from tests.support.boards import POLICY4
from tests.support.fakesys import FakeSysfs
from tests.support.loop import board_with_meter, cap


def recorder() -> tuple[EventBus, list[Event]]:
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    return events, seen


def test_constructing_the_loop_writes_no_cap_and_saves_no_baseline(fake: FakeSysfs) -> None:
    """Only start() touches the hardware: the owner has its restore in place by then."""
    board_with_meter(fake, 80.0, 5.0)
    saved = fake.root / "state/baseline.json"
    loop = ControlLoop(
        fake.root,
        board.detect(fake.root),
        LoopSettings(params=GovernorParams(max_mhz=2000.0)),
        events=EventBus(),
        baseline=Baseline.load([fake.root / "state"], fake.root),
    )
    assert cap(fake, POLICY4) == 2400000 and not saved.exists()
    assert loop.snapshot.state == "starting" and loop.snapshot.domains == ()
    loop.start()
    assert cap(fake, POLICY4) == 1800000 and saved.exists()
    assert [d.name for d in loop.snapshot.domains] == ["policy4", "fdab0000.npu"]


def test_a_stale_temperature_is_one_fault_until_readings_are_back() -> None:
    events, seen = recorder()
    ages = Freshness(events, started=0.0)
    ages.temperature = (70.0, 0.0)
    assert ages.readings(1.0, 1.0, metered=False) == Readings(70.0, None, False)
    assert ages.readings(1.5, 1.0, metered=False).temp_c is None
    assert ages.readings(2.0, 1.0, metered=False).temp_c is None
    ages.temperature = (71.0, 2.1)
    assert ages.readings(2.2, 1.0, metered=False).temp_c == 71.0
    assert [e.message for e in seen] == [
        "temperature unknown: no valid reading for 1 s; stepping down (fail-safe)",
        "temperature readings are back",
    ]


def test_a_meter_without_its_first_reading_is_not_silent_until_stale_s() -> None:
    events, seen = recorder()
    ages = Freshness(events, started=10.0)
    ages.temperature = (60.0, 10.5)
    assert ages.readings(10.5, 1.0, metered=True) == Readings(60.0, None, False)
    assert not seen
    ages.temperature = (60.0, 11.2)
    assert ages.readings(11.2, 1.0, metered=True) == Readings(60.0, None, True)
    assert [e.data for e in seen] == [{"signal": "power", "stale_s": 1.0}]


def test_rediscovery_is_periodic_without_udev_and_at_most_every_second_for_vanished_files() -> None:
    trigger = RediscoveryTrigger(None, now=0.0)
    assert trigger.reason(0.5, sensors_gone=True, rescan_s=10.0) is None
    assert trigger.reason(1.0, sensors_gone=True, rescan_s=10.0) == "a sensor file vanished"
    assert trigger.reason(1.5, sensors_gone=True, rescan_s=10.0) is None
    assert trigger.reason(10.9, sensors_gone=False, rescan_s=10.0) is None
    assert trigger.reason(11.0, sensors_gone=False, rescan_s=10.0) == "devices changed"


def test_nothing_to_govern_is_said_once_per_change(tmp_path: Path) -> None:
    governable = Governability(tmp_path)
    assert governable.check(temperature_sensors=True, domains=True) is None
    lost = governable.check(temperature_sensors=False, domains=True)
    assert lost is not None and lost.message == (
        f"nothing is governed: no temperature sensor found under {tmp_path}; "
        "every cap is held at its floor (fail-safe)"
    )
    assert governable.check(temperature_sensors=False, domains=True) is None
    nothing = governable.check(temperature_sensors=False, domains=False)
    assert nothing is not None and nothing.data == {
        "missing": ["temperature sensor", "frequency domain"]
    }
    assert nothing.message.endswith("no cap can be written")
    back = governable.check(temperature_sensors=True, domains=True)
    assert back is not None and back.message.startswith("governing again")


def test_an_action_report_names_every_change_and_the_reason() -> None:
    verdict = Verdict(Action.LOWER, "temperature 85.1 °C >= 85 °C")
    event = reports.action(
        verdict,
        [CapChange("policy0", 1479.0, 922.0), CapChange("57000000.gpu", None, 768.0)],
        {"demo": (8, 5)},
        Readings(85.1, 9.8, True),
    )
    assert event.message == (
        "lower: policy0 1479 -> 922 MHz, 57000000.gpu ? -> 768 MHz, batch demo 8 -> 5 "
        "(temperature 85.1 °C >= 85 °C)"
    )
    assert event.data["batch"] == {"demo": {"old": 8, "new": 5}}
    assert event.data["caps"]["policy0"] == {"old_mhz": 1479.0, "new_mhz": 922.0}


def test_batch_sizes_move_with_the_verdict_by_swapping_the_mapping() -> None:
    governor = HysteresisGovernor()
    sizes = BatchSizes({"resnet": 16, "tiny": 1})
    before = sizes.sizes
    assert sizes.step(governor, Verdict(Action.HOLD, "band"), {"resnet": 16, "tiny": 1}) == {}
    changed = sizes.step(governor, Verdict(Action.LOWER, "hot"), {"resnet": 16, "tiny": 1})
    assert changed == {"resnet": (16, 11)}
    assert before == {"resnet": 16, "tiny": 1}  # the batcher's reference is never changed
    sizes.reload({"resnet": 8, "new": 4})
    assert sizes.sizes == {"resnet": 8, "new": 4}


def _controls(low_mhz: float) -> dict[str, DomainControl]:
    table = tuple(khz * 1000 for khz in (800, 1008, 1200, 1416, 1608, 1800))
    domain = FrequencyDomain("policy4", "cpufreq", Path("/sys/x"), table[0], table[-1], table)
    return {"policy4": DomainControl(domain, low_mhz, 1800.0, 1800.0)}


def test_learned_power_stays_with_its_caps_when_the_levels_are_renumbered() -> None:
    """A new clamp drops the lowest levels: a peak learned at 1416 MHz must stay at 1416 MHz,
    not move to whatever level now has its old index (which would let the policy raise into
    caps it measured over the limit)."""
    driver = PolicyDriver(AdaptiveGovernor())
    driver.adopt(_controls(800.0))
    at = {dict(lv.caps_mhz)["policy4"]: i for i, lv in enumerate(driver.state.levels)}
    learned_w = ((at[1416.0], 12.5, 7.0), (at[800.0], 4.0, 7.0))
    driver.state = replace(
        driver.state, adaptive=replace(driver.state.adaptive, learned_w=learned_w)
    )
    driver.adopt(_controls(1200.0))
    learned = {
        dict(driver.state.levels[i].caps_mhz)["policy4"]: (w, when)
        for i, w, when in driver.state.adaptive.learned_w
    }
    assert learned == {1416.0: (12.5, 7.0)}  # 800 MHz is no level any more: its peak is gone
