"""The control loop on static fake trees and closed around the simulator, with an injected clock."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from governors import GovernorParams
from mcpd.config import DomainSection
from mcpd.governor import snapshot_builder as snapshots
from mcpd.governor.loop_settings import LoopSettings
from mcpd.governor.notify import Notifier
from mcpd.governor.timing import Grid
from mcpd.sim import PROFILES, LoadSchedule, Simulator
from mcpd.snapshot import Snapshot
from sensors.discovery import PowerOptions
from tests.support.boards import NPU, POLICY4, RK_A76_KHZ
from tests.support.fakesys import FakeSysfs
from tests.support.loop import (
    INA_CURR,
    board_with_meter,
    cap,
    make_loop,
    run_for,
    set_power,
    set_temp,
)


@pytest.mark.parametrize(
    ("celsius", "watts", "policy4", "npu"),
    [
        (
            85.0,
            5.0,
            1608000,
            800000000,
        ),  # hot: 2400 x 0.7 = 1680 -> 1608; npu 1000 x 0.7 -> floor 800
        (60.0, 12.0, 1608000, 800000000),  # power at the limit
        (80.0, 5.0, 2400000, 1000000000),  # hold band
        (60.0, 10.0, 2400000, 1000000000),  # hold band on power
        (75.0, 9.0, 2400000, 1000000000),  # cool, already at the top
    ],
)
def test_one_decision(
    fake: FakeSysfs, celsius: float, watts: float, policy4: int, npu: int
) -> None:
    board_with_meter(fake, celsius, watts)
    loop, clock, _ = make_loop(fake.root)
    loop.tick(clock.now)
    assert (cap(fake, POLICY4), cap(fake, NPU)) == (policy4, npu)


def test_recovery_below_75_and_9_climbs_through_a_coarse_table(fake: FakeSysfs) -> None:
    board_with_meter(fake, 90.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 2.0)
    assert cap(fake, POLICY4) == 816000  # the 800 MHz floor: the lowest entry at or above it
    set_temp(fake, 74.0)
    set_power(fake, 8.0)
    caps = []
    for _ in range(20):
        run_for(loop, clock, 0.1)
        caps.append(cap(fake, POLICY4))
    assert caps[-1] == 2400000
    assert sorted(caps) == caps and len(set(caps)) >= 5  # climbed step by step, never stuck


def test_floor_is_the_configured_minimum_snapped(fake: FakeSysfs) -> None:
    board_with_meter(fake, 95.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 3.0)
    # The 800 MHz floor snaps up to the 816 MHz table entry, never down to 600 MHz below it.
    assert cap(fake, POLICY4) == 816000
    assert cap(fake, NPU) == 800000000
    assert loop.snapshot.state == "lowering"


def test_per_domain_override_and_disabled_domain(fake: FakeSysfs) -> None:
    board_with_meter(fake, 95.0, 5.0)
    overrides = {
        "fdab0000.npu": DomainSection(min_mhz=300.0),
        "policy4": DomainSection(enabled=False),
    }
    loop, clock, _ = make_loop(fake.root, LoopSettings(domain_overrides=overrides))
    run_for(loop, clock, 3.0)
    assert cap(fake, NPU) == 300000000
    assert cap(fake, POLICY4) == 2400000  # left alone
    assert [d.name for d in loop.snapshot.domains] == ["fdab0000.npu"]


def test_baseline_saved_when_domains_are_adopted_not_at_the_first_write(fake: FakeSysfs) -> None:
    board_with_meter(fake, 80.0, 5.0)  # in the band: nothing to write
    overrides = {"policy4": DomainSection(enabled=False)}
    loop, clock, _ = make_loop(fake.root, LoopSettings(domain_overrides=overrides))
    run_for(loop, clock, 1.0)
    saved = json.loads((fake.root / "state/baseline.json").read_text())["domains"]
    # A domain mcpd does not govern is not recorded.
    assert saved == {
        "fdab0000.npu": {"path": "sys/class/devfreq/fdab0000.npu/max_freq", "value": "1000000000"}
    }


def test_throttling_never_waits_for_the_baseline_to_be_saved(
    fake: FakeSysfs, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk or a broken folder costs the guarantee of restore-after-crash, never the cap
    writes; the copies are saved as soon as they can be."""
    board_with_meter(fake, 95.0, 5.0)
    (fake.root / "state").write_text("not a folder")
    (fake.root / "run").mkdir()
    (fake.root / "run/mcpd").write_text("not a folder either")
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 1.0)
    assert cap(fake, POLICY4) < 2400000  # throttled all the same
    assert "restore after a crash is not guaranteed" in caplog.text
    assert loop.baseline is not None and loop.baseline.at_risk is not None
    (fake.root / "state").unlink()
    (fake.root / "run/mcpd").unlink()
    run_for(loop, clock, 1.5)
    for copy in ("state", "run/mcpd"):
        saved = json.loads((fake.root / copy / "baseline.json").read_text())["domains"]
        assert saved["policy4"] == {
            "path": "sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq",
            "value": "2400000",
        }
    assert loop.baseline.at_risk is None


def test_a_state_folder_removed_at_run_time_is_made_again(fake: FakeSysfs) -> None:
    board_with_meter(fake, 80.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 1.0)
    shutil.rmtree(fake.root / "state")
    run_for(loop, clock, 1.5)  # housekeeping runs once a second
    saved = json.loads((fake.root / "state/baseline.json").read_text())["domains"]
    assert saved["policy4"]["value"] == "2400000"


def test_disjoint_range_uses_the_hardware_range(fake: FakeSysfs) -> None:
    board_with_meter(fake, 95.0, 5.0)
    loop, clock, _ = make_loop(
        fake.root, LoopSettings(params=GovernorParams(min_mhz=1500.0, max_mhz=3200.0))
    )
    run_for(loop, clock, 3.0)
    (npu,) = [d for d in loop.snapshot.domains if d.name == "fdab0000.npu"]
    assert (npu.min_mhz, npu.max_mhz) == (300.0, 1000.0)
    assert cap(fake, NPU) == 300000000


def test_cap_outside_the_range_is_brought_in_at_start(fake: FakeSysfs) -> None:
    board_with_meter(fake, 80.0, 5.0)
    make_loop(fake.root, LoopSettings(params=GovernorParams(max_mhz=2000.0)))
    assert cap(fake, POLICY4) == 1800000


def test_batch_sizes_follow_the_same_rule(fake: FakeSysfs) -> None:
    board_with_meter(fake, 90.0, 5.0)
    loop, clock, events = make_loop(fake.root, LoopSettings(models={"resnet": 16, "tiny": 1}))
    assert loop.batch_size("resnet") == 16
    loop.tick(clock.now)
    assert loop.batch_size("resnet") == 11 and loop.batch_size("tiny") == 1
    run_for(loop, clock, 2.0)
    assert loop.batch_size("resnet") == 1
    set_temp(fake, 60.0)
    run_for(loop, clock, 4.0)
    assert loop.batch_size("resnet") == 16
    assert loop.snapshot.batch == {"resnet": 16, "tiny": 1}
    assert any(e.data.get("batch", {}).get("resnet") == {"old": 16, "new": 11} for e in events)


def test_sampling_periods_and_deadlines(fake: FakeSysfs) -> None:
    board_with_meter(fake, 80.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    temps = powers = 0
    sample_temperatures, sample_powers = (
        loop.sensors.sample_temperatures,
        loop.sensors.sample_powers,
    )

    def count_t(now):  # type: ignore[no-untyped-def]
        nonlocal temps
        temps += 1
        return sample_temperatures(now)

    def count_p(now):  # type: ignore[no-untyped-def]
        nonlocal powers
        powers += 1
        return sample_powers(now)

    loop.sensors.sample_temperatures = count_t  # type: ignore[method-assign]
    loop.sensors.sample_powers = count_p  # type: ignore[method-assign]
    run_for(loop, clock, 9.99)
    assert (temps, powers) == (50, 100)


def test_sensors_that_only_report_are_read_once_a_second(fake: FakeSysfs) -> None:
    """The governing zone and the board's input rail at every sample; PMIC-Die (never governs)
    and the VDD_SOC rail (not in the power plan) once a second, for the status."""
    board_with_meter(fake, 60.0, 5.0)
    fake.zone(1, "PMIC-Die", 100000)
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 0.05)
    rail = "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1/curr2_input"
    fake.file(rail, "200\n")  # VDD_SOC 0.5 W -> 1 W
    fake.file("sys/devices/virtual/thermal/thermal_zone1/temp", "90000\n")
    set_temp(fake, 62.0)
    set_power(fake, 6.0)
    run_for(loop, clock, 0.5)
    seen = loop.snapshot
    assert (seen.temperature_c, seen.power_w) == (62.0, pytest.approx(6.0))
    assert seen.temperatures["PMIC-Die"] == 100.0
    assert seen.powers["VDD_SOC"] == pytest.approx(0.5)
    run_for(loop, clock, 0.7)  # past the next second
    assert loop.snapshot.temperatures["PMIC-Die"] == 90.0
    assert loop.snapshot.powers["VDD_SOC"] == pytest.approx(1.0)


def test_the_snapshot_is_built_when_read_not_at_every_sample(
    fake: FakeSysfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    board_with_meter(fake, 60.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    built = 0
    build = snapshots.build

    def counted(**parts: Any) -> Snapshot:
        nonlocal built
        built += 1
        return build(**parts)

    monkeypatch.setattr(snapshots, "build", counted)
    run_for(loop, clock, 9.99)  # 100 samples; housekeeping reads it for STATUS= once a second
    assert built == 10
    sampled = clock.now
    clock.now += 0.05  # read between two samples: it describes the newest one
    seen = loop.snapshot
    assert (seen.power_w, seen.ts, built) == (
        pytest.approx(5.0),
        pytest.approx(1.7e9 + sampled),
        11,
    )


def test_next_deadline_keeps_the_grid_and_skips_missed_ticks() -> None:
    grid = Grid(10.0, 0.2)
    grid.advance(10.05)
    assert grid.deadline == pytest.approx(10.2)
    grid.advance(10.95)
    assert grid.deadline == pytest.approx(11.0)  # 10.2 .. 10.8 were missed
    grid.advance(11.0)
    assert grid.deadline == pytest.approx(11.2)


def test_a_tick_where_both_samples_are_due_is_one_decision_on_both(fake: FakeSysfs) -> None:
    """Temperature (every 200 ms) and power (every 100 ms) are both due at every other tick: one
    decision there, on the new reading of each. Before, the grids summed in floats met one ulp
    apart (at 0.6 s from 0.0), the power sample was decided on with the 90 °C read at 0.4 s,
    which had already lowered the caps at 0.4 and 0.5 s, and the new 80 °C only after it."""
    board_with_meter(fake, 90.0, 5.0)
    loop, clock, _ = make_loop(fake.root, LoopSettings(models={"m": 10**9}))
    clock.now = 0.0
    run_for(loop, clock, 0.5)
    lowered = loop.batch_size("m")
    set_temp(fake, 80.0)  # in the band: hold
    run_for(loop, clock, 0.1)  # the tick at 0.6 s
    assert loop.batch_size("m") == lowered


def test_a_hot_board_is_stepped_once_per_tick(fake: FakeSysfs) -> None:
    """The seed rule once per 100 ms tick: eleven x0.7 steps in the ticks from 0 to 1 s (there
    were fourteen: three readings applied twice, x0.49 at once)."""
    board_with_meter(fake, 90.0, 5.0)
    loop, clock, _ = make_loop(fake.root, LoopSettings(models={"m": 10**9}))
    clock.now = 0.0
    run_for(loop, clock, 1.0)
    eleven_steps = 10**9
    for _ in range(11):
        eleven_steps = math.floor(eleven_steps * 0.7)
    assert loop.batch_size("m") == eleven_steps


def test_stale_temperature_is_fail_safe_after_one_second(fake: FakeSysfs) -> None:
    board_with_meter(fake, 80.0, 5.0)
    loop, clock, events = make_loop(fake.root)
    run_for(loop, clock, 1.0)
    set_temp(fake, -256.0)  # the zone goes power-gated: no valid reading
    run_for(loop, clock, 0.5)
    assert (
        cap(fake, POLICY4) == 2400000 and loop.snapshot.state == "holding"
    )  # last value still fresh
    run_for(loop, clock, 1.0)
    assert loop.snapshot.state == "fail-safe"
    assert cap(fake, POLICY4) < 2400000
    assert any(e.kind == "fault" and "temperature unknown" in e.message for e in events)
    set_temp(fake, 60.0)
    run_for(loop, clock, 0.3)
    assert loop.snapshot.state == "raising"
    assert any(e.kind == "fault" and e.message == "temperature readings are back" for e in events)


def test_silent_power_meter_is_fail_safe(fake: FakeSysfs) -> None:
    board_with_meter(fake, 60.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 1.0)
    fake.file(INA_CURR, "garbage\n")
    run_for(loop, clock, 1.5)
    assert loop.snapshot.state == "fail-safe"
    assert cap(fake, POLICY4) == 816000


def test_rapl_without_a_first_reading_is_not_a_failed_meter(tmp_path: Path) -> None:
    """RAPL gives no power until its second energy sample: the first decisions go by temperature
    alone, with no fail-safe cut at start."""
    sim = Simulator(PROFILES["x86-intel"], tmp_path / "board", load=LoadSchedule("idle"))
    sim.build()
    loop, clock, events = make_loop(sim.root)
    assert loop.sensors.power_plan.metered
    run_for(loop, clock, 2.0, sim)
    assert not [e for e in events if e.kind == "governor" and e.data["action"] == "lower"]
    assert not [e for e in events if e.kind == "fault"]


def test_meter_that_never_reads_is_fail_safe_after_stale_ms(fake: FakeSysfs) -> None:
    board_with_meter(fake, 60.0, 5.0)
    fake.file(INA_CURR, "garbage\n")
    loop, clock, events = make_loop(fake.root)
    run_for(loop, clock, 0.9)
    assert cap(fake, POLICY4) == 2400000 and loop.snapshot.state == "raising"
    run_for(loop, clock, 0.5)
    assert loop.snapshot.state == "fail-safe" and cap(fake, POLICY4) < 2400000
    assert any(e.kind == "fault" and "power unknown" in e.message for e in events)


def test_power_limit_below_the_floor_draw_is_reported_once(tmp_path: Path) -> None:
    sim = Simulator(PROFILES["jetson-agx-orin"], tmp_path / "board")
    sim.build()
    loop, clock, events = make_loop(sim.root)
    run_for(loop, clock, 10.0, sim)
    floor = [e for e in events if "cannot be met" in e.message]
    assert len(floor) == 1 and floor[0].data == {
        "signal": "power",
        # Every domain at the lowest table entry at or above the 800 MHz floor, for a second
        # (docs/power-modes.md: about 17.5 W there under full load).
        "value": pytest.approx(17.5, abs=1.5),
        "limit": 12.0,
    }
    assert all(c.target == c.low for c in loop.actuators.controls.values())


def test_the_reading_that_moves_the_caps_to_the_floor_is_not_a_floor_reading(
    tmp_path: Path,
) -> None:
    # x86-amd's table has three entries: adaptive's first cut from 2100 MHz (17.7 W) goes
    # straight to the 1400 MHz floor, which draws 6 W.
    sim = Simulator(PROFILES["x86-amd"], tmp_path / "board")
    sim.build()
    loop, clock, events = make_loop(sim.root, LoopSettings(policy="adaptive"))
    run_for(loop, clock, 1.5, sim)
    assert [e for e in events if e.kind == "governor" and e.data["action"] == "lower"]
    assert not [e for e in events if "cannot be met" in e.message]


def test_temperature_over_the_limit_at_the_floor_is_reported_once(fake: FakeSysfs) -> None:
    board_with_meter(fake, 90.0, 5.0)
    loop, clock, events = make_loop(fake.root)
    run_for(loop, clock, 5.0)
    # The die may still be cooling from the caps it had: not yet.
    assert not [e for e in events if "cannot be met" in e.message]
    run_for(loop, clock, 30.0)
    (event,) = [e for e in events if "cannot be met" in e.message]
    assert event.data == {"signal": "temperature", "value": 90.0, "limit": 85.0}


def test_vanished_sensor_and_renumbered_hwmon_are_rediscovered(fake: FakeSysfs) -> None:
    board_with_meter(fake, 60.0, 5.0)
    loop, clock, events = make_loop(fake.root)
    run_for(loop, clock, 0.5)
    fake.renumber_hwmon("sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040", 1, 9)
    run_for(loop, clock, 2.0)
    assert loop.snapshot.power_w == pytest.approx(5.0)
    assert loop.snapshot.state != "fail-safe"
    assert any("re-discovered (a sensor file vanished)" in e.message for e in events)


def test_reload_is_applied_whole_at_a_tick(fake: FakeSysfs) -> None:
    board_with_meter(fake, 80.0, 5.0)
    loop, clock, _ = make_loop(fake.root, LoopSettings(models={"m": 8}))
    run_for(loop, clock, 1.0)
    assert cap(fake, POLICY4) == 2400000
    loop.request_reload(
        LoopSettings(
            params=GovernorParams(temp_high_c=79.0, temp_low_c=70.0), models={"m": 4, "n": 2}
        )
    )
    assert cap(fake, POLICY4) == 2400000  # nothing happens until the loop's next tick
    run_for(loop, clock, 0.1)  # one decision: a power sample, with the newest temperature
    assert cap(fake, POLICY4) < 2400000
    assert loop.snapshot.batch == {"m": 2, "n": 1}


def test_a_reload_that_leaves_the_policy_alone_keeps_its_raise_hold(fake: FakeSysfs) -> None:
    """A reload that changes nothing of the policy (here: a model added) keeps its state, the
    adaptive policy's as the raise hold's: the hold goes on counting. Before, it started over."""
    board_with_meter(fake, 90.0, 5.0)
    settings = LoopSettings(raise_hold_s=1.0)
    loop, clock, _ = make_loop(fake.root, settings)
    loop.tick(clock.now)
    set_temp(fake, 60.0)  # read at 0.2 s: from then, raises are held 1 s
    run_for(loop, clock, 0.15)
    lowered = cap(fake, POLICY4)
    run_for(loop, clock, 0.5)
    loop.request_reload(replace(settings, models={"m": 8}))  # at 0.7 s
    run_for(loop, clock, 0.7)  # to 1.35 s: more than 1 s below the thresholds
    assert cap(fake, POLICY4) > lowered


def test_pause_holds_everything(fake: FakeSysfs) -> None:
    board_with_meter(fake, 95.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    loop.paused = True
    run_for(loop, clock, 2.0)
    assert cap(fake, POLICY4) == 2400000 and loop.snapshot.state == "paused"


def test_watchdog_pinged_from_the_loop_and_status_sent(fake: FakeSysfs, tmp_path: Path) -> None:
    board_with_meter(fake, 80.0, 5.0)
    address = str(tmp_path / "notify")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(address)
    receiver.setblocking(False)
    notifier = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "2000000"})
    loop, clock, _ = make_loop(fake.root, notifier=notifier)
    run_for(loop, clock, 3.05)
    notifier.close()
    messages = []
    while True:
        try:
            messages.append(receiver.recv(4096).decode())
        except BlockingIOError:
            break
    receiver.close()
    assert messages.count("WATCHDOG=1") == 4  # every 1 s: half of WatchdogSec
    statuses = [m for m in messages if m.startswith("STATUS=")]
    assert len(statuses) == 4
    assert statuses[-1] == "STATUS=80.0 °C 5.00 W | policy4 2400 fdab0000.npu 1000 MHz | holding"


def test_closed_loop_keeps_a_jetson_within_its_envelope(tmp_path: Path) -> None:
    """Sustained full load: without a governor the plant settles near 100 °C and 14.7 W."""
    sim = Simulator(
        PROFILES["jetson-orin-nano"], tmp_path / "board", load=LoadSchedule("sustained"), speed=5.0
    )
    sim.build()
    loop, clock, _ = make_loop(sim.root)
    temps, powers = [], []
    for _ in range(60):
        run_for(loop, clock, 1.0, sim)
        temps.append(loop.snapshot.temperature_c or 0.0)
        powers.append(sim.state.input_w)
    assert max(temps) < 86.0
    assert sum(p > 12.5 for p in powers[2:]) == 0
    assert sim.work_mhz_s["policy0"] > 0.5 * 1510.4 * 300  # it still works at more than half speed


def test_closed_loop_throttles_at_85_and_recovers_below_75(tmp_path: Path) -> None:
    sim = Simulator(
        PROFILES["rk3588"], tmp_path / "board", load=LoadSchedule("bursts", 120.0, 120.0), speed=5.0
    )
    sim.build()
    loop, clock, events = make_loop(sim.root)
    trace = []
    for _ in range(48):
        run_for(loop, clock, 1.0, sim)
        trace.append((loop.snapshot.temperature_c or 0.0, sim.caps_khz[1]))
    hot = [t for t, _ in trace[:24]]
    assert 82.0 < max(hot) < 88.0, max(hot)  # sampled once a second: the peak falls between
    lowered = [e for e in events if e.kind == "governor" and e.data["action"] == "lower"]
    assert 85.0 <= lowered[0].data["temperature_c"] < 86.0
    assert min(c for _, c in trace[:24]) < 2400000  # throttled during the burst
    assert trace[-1][1] == 2400000 and trace[-1][0] <= 75.0  # back to full clocks once cool
    actions = [e.data["action"] for e in events if e.kind == "governor"]
    assert "lower" in actions and "raise" in actions


def test_adaptive_policy_settles_below_the_threshold_and_holds(tmp_path: Path) -> None:
    """Sustained load on an RK3588: where the seed rule cycles in its band, the adaptive policy
    comes down a level at a time ahead of 85 °C and then holds, with its batch sizes following."""
    sim = Simulator(PROFILES["rk3588"], tmp_path / "board", load=LoadSchedule("sustained"))
    sim.build()
    loop, clock, events = make_loop(sim.root, LoopSettings(policy="adaptive", models={"m": 8}))
    temps = []
    for _ in range(240):
        run_for(loop, clock, 1.0, sim)
        temps.append(loop.snapshot.temperature_c or 0.0)
    assert max(temps) < 85.5 and min(temps[-60:]) > 80.0
    changes = [e for e in events if e.kind == "governor" and e.data["caps"]]
    late = [e for e in changes if e.data["action"] == "lower"]
    assert late and len(changes) <= 20
    caps = {d.name: d.cap_mhz for d in loop.snapshot.domains}
    assert tuple(caps.items()) in {level.caps_mhz for level in loop.policy.state.levels}
    assert loop.snapshot.batch["m"] < 8


def test_adaptive_policy_fills_the_gap_between_two_uniform_levels(tmp_path: Path) -> None:
    """x86-amd's cores draw 10 W all at 1700 MHz and 18 W all at 2100 MHz: under 12 W the
    adaptive policy runs some cores at 2100 MHz instead of all at 1700, its meter (RAPL's
    package power) never reaching 12 W after the first second."""
    sim = Simulator(PROFILES["x86-amd"], tmp_path / "board", load=LoadSchedule("sustained"))
    sim.build()
    loop, clock, _ = make_loop(sim.root, LoopSettings(policy="adaptive"))
    watts = []
    for _ in range(60 * 5):
        run_for(loop, clock, 0.2, sim)
        watts.append(loop.snapshot.power_w or 0.0)
    caps = sorted(d.cap_mhz for d in loop.snapshot.domains)
    assert caps[0] == 1700.0 and caps[-1] == 2100.0
    assert max(watts[5:]) < 12.0


def test_adaptive_policy_on_an_estimate_stays_under_the_true_limit(tmp_path: Path) -> None:
    """The RK3588 has no meter: governed on its estimate (which reads a few percent low), with
    each level's power at full load from the same Energy Model, the true input power stays under
    12 W through bursts after the first second, and idle spells do not raise it into a level the
    next burst would take over."""
    sim = Simulator(PROFILES["rk3588"], tmp_path / "board", load=LoadSchedule("bursts", 30, 30))
    sim.build()
    settings = LoopSettings(
        policy="adaptive", power=PowerOptions(coefficients={"fdab0000.npu": 3600.0})
    )
    loop, clock, _ = make_loop(sim.root, settings)
    forecasts = [level.full_load_w for level in loop.policy.state.levels]
    assert all(isinstance(w, float) for w in forecasts) and forecasts == sorted(forecasts)
    watts = []
    for _ in range(150 * 5):
        run_for(loop, clock, 0.2, sim)
        watts.append(sim.state.input_w)
    assert max(watts[5:]) < 12.0
    assert max(watts[5:]) > 11.0  # and close to it: not a blanket cut


def test_reload_switches_policy_from_the_level_in_force(fake: FakeSysfs) -> None:
    board_with_meter(fake, 80.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 1.0)
    loop.request_reload(LoopSettings(policy="adaptive"))
    set_temp(fake, 85.0)
    run_for(loop, clock, 0.2)
    # One level down (0.92 x max: 2208 MHz and the NPU's 900), not the seed rule's x 0.7.
    assert cap(fake, POLICY4) == 2208000 and cap(fake, NPU) == 900000000


def test_a_passive_trip_at_mcpds_threshold_is_reported_once(fake: FakeSysfs) -> None:
    """RK3588 mainline: passive at 85 °C on the CPU zones, the seed rule's own threshold."""
    board_with_meter(fake, 60.0, 5.0)
    zone = "sys/devices/virtual/thermal/thermal_zone0"
    for index, (millidegrees, kind) in enumerate(((85000, "passive"), (115000, "critical"))):
        fake.file(f"{zone}/trip_point_{index}_temp", f"{millidegrees}\n")
        fake.file(f"{zone}/trip_point_{index}_type", f"{kind}\n")
    fake.zone(1, "gpu-thermal", 60000)
    fake.file("sys/devices/virtual/thermal/thermal_zone1/trip_point_0_temp", "-32768000\n")
    fake.file("sys/devices/virtual/thermal/thermal_zone1/trip_point_0_type", "passive\n")
    loop, clock, events = make_loop(fake.root)
    run_for(loop, clock, 3.0)
    (event,) = [e for e in events if e.kind == "competitor"]
    assert "soc-thermal 85 °C" in event.message
    assert event.data["trips"] == [{"zone": "soc-thermal", "celsius": 85.0}]
    quiet, clock, events = make_loop(
        fake.root, LoopSettings(params=GovernorParams(temp_high_c=80.0))
    )
    run_for(quiet, clock, 2.0)
    assert not [e for e in events if e.kind == "competitor"]


def test_a_cap_changed_by_someone_else_is_reported_and_followed(fake: FakeSysfs) -> None:
    board_with_meter(fake, 80.0, 5.0)  # in the band: the governor holds
    loop, clock, events = make_loop(fake.root)
    run_for(loop, clock, 1.5)
    fake.file(POLICY4, "1608000\n")  # thermald, nvpmodel or a person
    run_for(loop, clock, 2.0)
    (event,) = [e for e in events if e.kind == "competitor"]
    assert event.data == {"domain": "policy4", "expected_mhz": 2400.0, "found_mhz": 1608.0}
    assert cap(fake, POLICY4) == 1608000  # not written back
    assert loop.actuators.controls["policy4"].target == 1608.0
    assert loop.snapshot.external_cap_changes == 1
    set_temp(fake, 70.0)  # governing goes on from there
    run_for(loop, clock, 0.2)
    assert 1608000 < cap(fake, POLICY4) < 2400000  # x 1.15 per decision from 1608, not 2400
    run_for(loop, clock, 2.0)
    assert len([e for e in events if e.kind == "competitor"]) == 1  # its own writes are not news


def test_headroom_in_the_snapshot(fake: FakeSysfs) -> None:
    board_with_meter(fake, 70.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 0.5)
    assert loop.snapshot.headroom == pytest.approx(0.5)  # 15 of the 30 °C window left


def test_a_receiver_that_stops_reading_never_blocks_the_loop(
    fake: FakeSysfs, tmp_path: Path
) -> None:
    """A unix datagram queue holds ~10 messages; after that a blocking sendto() would hang."""
    board_with_meter(fake, 80.0, 5.0)
    address = str(tmp_path / "notify")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(address)
    notifier = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"})
    loop, clock, _ = make_loop(fake.root, notifier=notifier)
    worker = threading.Thread(
        target=run_for, args=(loop, clock, 30.0), daemon=True
    )  # hundreds of messages
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "the loop is stuck sending to systemd"
    notifier.close()
    receiver.close()


def test_a_board_with_nothing_to_govern_says_so_loudly(
    fake: FakeSysfs, caplog: pytest.LogCaptureFixture
) -> None:
    fake.file("proc/sys/kernel/random/boot_id", "0b3a9c2e-0000-4000-8000-000000000000\n")
    fake.zone(0, "soc-thermal", 60000)  # a sensor, but no cpufreq policy and no devfreq
    with caplog.at_level(logging.WARNING, "mcpd.governor.loop"):
        loop, clock, events = make_loop(fake.root)
        run_for(loop, clock, 1.0)
    assert loop.snapshot.state == "ungoverned"
    assert f"nothing is governed: no frequency domain found under {fake.root}" in caplog.text
    fake.cpufreq(4, (4, 5), 408000, 2400000, (*RK_A76_KHZ, 2400000))  # the driver loads
    shutil.rmtree(fake.root / "sys/devices/virtual/thermal/thermal_zone0")  # and the zone goes
    (fake.root / "sys/class/thermal/thermal_zone0").unlink()
    run_for(loop, clock, 12.0)  # the periodic rescan finds both changes
    messages = [e.message for e in events if e.kind == "fault"]
    assert any("nothing is governed: no temperature sensor found" in m for m in messages)
    assert loop.snapshot.state == "fail-safe" and cap(fake, POLICY4) < 2400000


def test_the_first_sample_is_due_at_the_first_tick_not_at_start(fake: FakeSysfs) -> None:
    """The daemon starts its services between the loop's start (discovery, adoption) and its first
    tick: those milliseconds are not a sample's lateness."""
    board_with_meter(fake, 50.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    clock.now += 0.040
    loop.tick(clock.now)
    late = loop.timing.summary()["sample_lateness"]
    assert late is not None and late["count"] == 2 and late["max_ms"] == 0.0


def test_power_is_read_before_the_zones_when_both_are_due(fake: FakeSysfs) -> None:
    """The second read of a tick is late by the first one's duration: the meter's read is the
    cheaper, so it goes first."""
    board_with_meter(fake, 50.0, 5.0)
    loop, clock, _ = make_loop(fake.root)
    read_temperatures = loop.sensors.sample_temperatures
    read_powers = loop.sensors.sample_powers

    def slow_temperatures(now: float | None = None) -> Any:
        clock.now += 0.003
        return read_temperatures(now)

    def slow_powers(now: float) -> Any:
        clock.now += 0.0005
        return read_powers(now)

    loop.sensors.sample_temperatures = slow_temperatures  # type: ignore[method-assign]
    loop.sensors.sample_powers = slow_powers  # type: ignore[method-assign]
    loop.tick(clock.now)
    late = loop.timing.summary()["sample_lateness"]
    assert late is not None and late["count"] == 2
    assert late["max_ms"] == pytest.approx(0.5)


def test_cap_files_are_open_for_writing_from_adoption(fake: FakeSysfs) -> None:
    """The first cap write must not pay for the checked walk from the sysfs root: adoption opens
    the cap for writing (nothing is written until a decision)."""
    board_with_meter(fake, 50.0, 5.0)
    before = cap(fake, POLICY4)
    loop, _, _ = make_loop(fake.root)
    target = str((fake.root / POLICY4).resolve())
    writers = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if os.readlink(fd) != target:
                continue
        except OSError:
            continue
        flags = int(
            Path(f"/proc/self/fdinfo/{fd.name}").read_text().split("flags:")[1].split()[0], 8
        )
        writers.append(flags & os.O_ACCMODE == os.O_WRONLY)
    assert any(writers)
    assert cap(fake, POLICY4) == before
    assert loop.actuators.controls
