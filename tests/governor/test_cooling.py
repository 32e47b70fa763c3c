"""Cooling health on simulated boards: the real control loop feeding the cooling watch, the
simulator's cooling faults, and what the daemon says (README, "Cooling health").

The scenarios are bench/cooling_health.py's, on a shorter timeline: the board learns its baseline
over its first two hours, the change comes at 2 h 40 min (inside a window), and wear is to be
sustained for half an hour (`[cooling] sustained_s = 1800`, against the default 2 h). The loop
samples once a second instead of the daemon's 0.2 s and 0.1 s, so that a simulated hour costs
seconds here; the benchmark runs the daemon's settings. The stated time: a step in the resistance
of more than the warning is flagged within one window (half an hour) of it, plus `sustained_s`
or three windows, whichever is longer; here 2 h.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import pytest

from bench.cooling_health import Timeline, run
from mcpd import config
from mcpd.config import CoolingSection
from mcpd.governor.cooling_health import Estimate, Health
from mcpd.governor.cooling_store import CoolingStore, key
from mcpd.governor.daemon import Daemon
from mcpd.governor.loop_settings import LoopSettings
from mcpd.sim import PROFILES, LoadSchedule, Simulator

TIMELINE = Timeline(change_at_s=2 * 3600 + 2400, hours=5.0, sample_s=1.0, sustained_s=1800)
STATED_S = 1800 + max(1800, 3 * 1800)


@pytest.mark.slow
def test_a_fan_that_stops_is_flagged_within_the_stated_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="mcpd.governor.cooling"):
        result = run("jetson-orin-nano", "fan-stop", TIMELINE)
    assert result["events"][0] == (7200, "baseline")
    flagged = result["flagged_s"]
    assert isinstance(flagged, int)
    assert TIMELINE.change_at_s < flagged <= TIMELINE.change_at_s + STATED_S
    assert "cooling degraded: thermal resistance" in caplog.text
    # What it fitted: the plant's 6.4 °C/W within 2 %, and its × 1.6 within 2 %.
    assert abs(result["baseline_error"]) < 0.02  # type: ignore[arg-type]
    assert result["drift_error_max"] is not None and result["drift_error_max"] < 0.02  # type: ignore[operator]


DUST = Timeline(
    change_at_s=TIMELINE.change_at_s, hours=7.5, dust_s=3 * 3600.0, sample_s=1.0, sustained_s=1800
)


@functools.cache
def ran(profile: str, scenario: str, timeline: Timeline) -> dict[str, object]:
    """One simulated run, shared by the tests that read different figures of it."""
    return run(profile, scenario, timeline)


@pytest.mark.slow
def test_dust_is_flagged_within_the_stated_time_of_passing_the_warning() -> None:
    """× 1.5 over 3 h: +25 % at 1 h 30 min into it; the windows say so a little later (they see
    the mean of a resistance still rising), then it must be sustained."""
    result = ran("x86-intel", "dust", DUST)
    onset = DUST.change_at_s + 1.5 * 3600
    flagged = result["flagged_s"]
    assert isinstance(flagged, int) and onset < flagged <= onset + STATED_S + 1800


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="since the simulator's energy counters count at the caps in force, one window in "
    "the dust's ramp is 7.9 % off the plant's drift (median 0.2 %), its intercept -10.4 °C: "
    "the estimator's fault, to be fixed, not this bound",
)
def test_every_dust_window_follows_the_plants_drift() -> None:
    result = ran("x86-intel", "dust", DUST)
    assert result["drift_error_max"] is not None and result["drift_error_max"] < 0.03  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("profile", "scenario"), [("rk3588", "warm-room"), ("jetson-orin-nano", "warm-afternoon")]
)
def test_a_warm_room_is_not_wear(profile: str, scenario: str) -> None:
    """The air 10 °C warmer, at once or over three hours: the resistance stays where it was (the
    RK3588's power is its estimate), nothing is flagged."""
    result = ran(profile, scenario, TIMELINE)
    assert result["flagged_s"] is None
    assert [change for _, change in result["events"]] == ["baseline"]  # type: ignore[attr-defined]
    assert result["max_drift"] is not None and result["max_drift"] < 1.05  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("profile", "scenario"),
    [
        pytest.param(
            "rk3588",
            "warm-room",
            marks=pytest.mark.xfail(
                strict=True,
                reason="since the simulator's energy counters count at the caps in force, the "
                "RK3588's estimated power puts the intercept 11.2 °C up for the air's 10 °C (its "
                "resistance 11.5 % high, 8 % before): the estimator's fault",
            ),
        ),
        ("jetson-orin-nano", "warm-afternoon"),
    ],
)
def test_a_warm_room_moves_the_intercept_by_the_airs_change(profile: str, scenario: str) -> None:
    result = ran(profile, scenario, TIMELINE)
    shift = result["true_ambient_shift_c"]  # the air's, in the last windows
    assert isinstance(shift, float) and shift > 5.0
    assert result["intercept_shift_c"] == pytest.approx(shift, abs=1.0)


def daemon_on(root: Path, state: Path, **sections: dict[str, object]) -> Daemon:
    return Daemon(
        lambda: config.parse(
            {
                "daemon": {
                    "sysfs_root": str(root),
                    "state_dir": str(state),
                    "runtime_dir": str(state / "run"),
                    "socket": str(state / "mcpd.sock"),
                },
                **sections,
            }
        )
    )


def test_the_daemon_reports_the_baseline_its_state_folder_keeps(tmp_path: Path) -> None:
    """The status path asks the cooling watch, which finds the board's baseline in the state
    folder at its first look; the document carries it, and its drift in the window since; one of
    another sensor governing is not used."""
    sim = Simulator(PROFILES["rk3588"], tmp_path / "board", load=LoadSchedule("idle"))
    sim.build()
    daemon = daemon_on(sim.root, tmp_path / "state")
    daemon.loop.start()
    assert daemon.status()["cooling"] == {
        "state": "learning",
        "thermal_resistance_c_per_w": None,
        "time_constant_s": None,
        "intercept_c": None,
        "confidence": None,
        "baseline_c_per_w": None,
        "drift_ratio": None,
        "since": None,
        "updated": None,
        "windows": 0,
        "rejected": 0,
    }
    board = daemon.loop.cooling.collector.board
    assert json.loads(board)["platform"] == "rk3588" and json.loads(board)["power"] == "estimate"
    now = daemon.loop.clock()
    recent = Estimate(now - 1800, now, 7.0, 36.0, 10.0)
    health = Health(baseline=Estimate(now - 9000, now - 1800, 6.8, 35.0, 10.1), recent=(recent,))
    offset = daemon.loop.wall() - now
    assert CoolingStore(tmp_path / "state").keep([(board, health)], offset, now=0.0)
    again = daemon_on(sim.root, tmp_path / "state")
    again.loop.start()
    cooling = again.status()["cooling"]
    assert cooling["state"] == "normal" and cooling["baseline_c_per_w"] == 6.8
    assert cooling["thermal_resistance_c_per_w"] == 7.0 and cooling["drift_ratio"] == 1.029
    assert cooling["updated"] == pytest.approx(offset + now, abs=0.01)
    assert cooling["confidence"] == 0.333  # one window of the three the figures are made of
    other = key({**json.loads(board), "temperatures": ["soc-thermal"]})
    assert CoolingStore(tmp_path / "state").keep([(other, health)], offset, now=0.0)
    third = daemon_on(sim.root, tmp_path / "state")
    third.loop.start()
    assert third.status()["cooling"]["state"] == "learning"


def test_cooling_off_is_neither_fitted_nor_reported(tmp_path: Path) -> None:
    sim = Simulator(PROFILES["x86-intel"], tmp_path / "board")
    sim.build()
    daemon = daemon_on(sim.root, tmp_path / "state", cooling={"enabled": False})
    daemon.loop.start()
    watch = daemon.loop.cooling
    for tenth in range(20_000):  # a window and more of readings, as the loop hands them over
        watch.add_temperature(tenth / 10, 60.0 + tenth % 7)
        watch.add_power(tenth / 10, 5.0 + tenth % 11)
    assert watch.collector.take() == []
    assert daemon.status()["cooling"]["state"] == "off"


def test_a_reload_applies_the_cooling_settings(tmp_path: Path) -> None:
    sim = Simulator(PROFILES["x86-amd"], tmp_path / "board")
    sim.build()
    daemon = daemon_on(sim.root, tmp_path / "state")
    daemon.loop.start()
    assert daemon.loop.cooling.settings == CoolingSection()
    warning = CoolingSection(drift_warning=1.5, sustained_s=600)
    daemon.loop.request_reload(LoopSettings(cooling=warning))
    daemon.loop.tick(daemon.loop.clock())
    assert daemon.loop.cooling.settings == warning
