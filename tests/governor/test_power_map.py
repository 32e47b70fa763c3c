"""The adaptive policy's learned power, kept across restarts (mcpd/governor/power_map.py)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest

from governors import (
    Action,
    AdaptiveGovernor,
    AdaptivePolicy,
    AdaptiveState,
    Readings,
    uniform_levels,
)
from governors.adaptive_governor import caps_key
from governors.levels import DomainSteps
from mcpd.governor import power_map
from mcpd.governor.actuation import DomainControl
from mcpd.governor.decisions import PolicyDriver
from mcpd.governor.domains import FrequencyDomain
from mcpd.governor.loop import ControlLoop
from mcpd.governor.loop_settings import LoopSettings
from mcpd.governor.power_map import FILENAME, PowerMapStore
from mcpd.sim import PROFILES, LoadSchedule, Simulator
from tests.conftest import PROJECT
from tests.support.loop import make_loop, run_for

BOARD = {"platform": "x86-amd", "model": None, "meters": ["rapl"], "domains": {"policy0": [1]}}
HIGH = (("policy0", 2100.0),)
LOW = (("policy0", 1400.0),)


def test_peaks_come_back_on_the_same_board_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = PowerMapStore(tmp_path / "state")
    store.keep(BOARD, {HIGH: 17.7, LOW: 6.1}, now=0.0)
    assert (tmp_path / "state" / FILENAME).stat().st_mode & 0o777 == 0o644
    assert PowerMapStore(tmp_path / "state").load(BOARD) == {HIGH: 17.7, LOW: 6.1}
    other = {**BOARD, "meters": ["ina3221 VDD_IN"]}
    with caplog.at_level(logging.WARNING):
        assert PowerMapStore(tmp_path / "state").load(other) == {}
    assert "learned on another board, meter or set of frequency tables" in caplog.text
    assert PowerMapStore(tmp_path / "nowhere").load(BOARD) == {}


def test_saved_at_most_once_a_minute_and_only_with_something_new(tmp_path: Path) -> None:
    store = PowerMapStore(tmp_path)
    path = tmp_path / FILENAME
    store.keep(BOARD, {HIGH: 17.0}, now=0.0)
    written = path.stat().st_mtime_ns
    store.keep(BOARD, {HIGH: 18.0, LOW: 6.0}, now=30.0)  # new, but within the minute
    assert path.stat().st_mtime_ns == written
    os.utime(path, ns=(0, 0))
    store.keep(BOARD, {HIGH: 17.1}, now=100.0)  # up by less than 1 %: not worth a write
    assert path.stat().st_mtime_ns == 0
    store.keep(BOARD, {HIGH: 17.1, LOW: 6.0}, now=100.0)
    assert PowerMapStore(tmp_path).load(BOARD) == {HIGH: 17.1, LOW: 6.0}
    # What the policy holds now: a peak forgotten and learned again lower, one forgotten.
    store.keep(BOARD, {LOW: 5.0}, now=200.0)
    assert PowerMapStore(tmp_path).load(BOARD) == {LOW: 5.0}
    os.utime(path, ns=(0, 0))
    store.keep(BOARD, {LOW: 5.04}, now=300.0)  # moved by less than 1 %: not worth a write
    assert path.stat().st_mtime_ns == 0


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"[" * 100_000, "nested deeper than 32 levels"),  # issue 26: a RecursionError ended mcpd
        (b'{"format": 7}', "not a format-1 learned-power file"),
        (b'{"format": 1, "fingerprint": FP, "peaks": {}}', '"peaks" is not a list'),
        (b'{"format": 1, "fingerprint": FP, "peaks": [{"watts": 3}]}', "peaks[0]: no caps_mhz"),
        (
            b'{"format": 1, "fingerprint": FP, "peaks": [{"caps_mhz": {"policy0": 1400},'
            b' "watts": -2}]}',
            "peaks[0]: watts -2 is not in (0, 10000]",
        ),
        (
            b'{"format": 1, "fingerprint": FP, "peaks": [{"caps_mhz": {"policy0": 1400},'
            b' "watts": "12"}]}',
            "peaks[0]: watts '12' is not a number",
        ),
        (
            b'{"format": 1, "fingerprint": FP, "peaks": [{"caps_mhz": {"policy0": "max"},'
            b' "watts": 12}]}',
            "peaks[0]: caps_mhz must be numbers",
        ),
    ],
)
def test_a_file_that_is_not_what_mcpd_writes_is_named_and_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, problem: str
) -> None:
    (tmp_path / FILENAME).write_bytes(content.replace(b"FP", json.dumps(BOARD).encode()))
    with caplog.at_level(logging.WARNING):
        assert PowerMapStore(tmp_path).load(BOARD) == {}
    assert problem in caplog.text and str(tmp_path / FILENAME) in caplog.text
    store = PowerMapStore(tmp_path)
    store.keep(BOARD, {LOW: 6.0}, now=0.0)  # replaced at the next save
    assert PowerMapStore(tmp_path).load(BOARD) == {LOW: 6.0}


def test_a_planted_link_is_neither_read_nor_written_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "elsewhere"
    planted = power_map.render(BOARD, {HIGH: 1.0})
    target.write_bytes(planted)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / FILENAME).symlink_to(target)
    store = PowerMapStore(tmp_path / "state")
    with caplog.at_level(logging.WARNING):
        assert store.load(BOARD) == {}
    assert "symlink" in caplog.text
    store.keep(BOARD, {HIGH: 17.7}, now=0.0)
    assert not (tmp_path / "state" / FILENAME).is_symlink()  # replaced, not followed
    assert target.read_bytes() == planted


def test_a_folder_that_cannot_be_written_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state").write_text("a file where the folder should be\n")
    store = PowerMapStore(tmp_path / "state")
    with caplog.at_level(logging.WARNING):
        store.keep(BOARD, {HIGH: 17.7}, now=0.0)
        store.keep(BOARD, {HIGH: 18.7}, now=100.0)
    assert caplog.text.count("learned power not saved") == 1


LEVELS = uniform_levels([DomainSteps("policy0", 2100.0, (1400.0, 1700.0, 2100.0))])


def test_a_level_known_to_draw_over_the_limit_is_left_before_the_load_arrives() -> None:
    policy = AdaptivePolicy()
    known = AdaptiveState(level=2, learned_w=((2, 17.7, 0.0), (1, 10.1, 0.0)))
    idle = Readings(60.0, 4.0, metered=True)
    verdict, state = policy.decide(known, idle, 10.0, LEVELS)
    assert verdict.action is Action.LOWER and state.level == 1
    assert "learned peak 17.70 W >= 11.94 W" in verdict.reason
    verdict, state = policy.decide(AdaptiveState(level=2), idle, 10.0, LEVELS)
    assert verdict.action is Action.HOLD and state.level == 2  # nothing known: nothing to do


def learned_on_x86_amd(tmp_path: Path) -> tuple[Path, ControlLoop]:
    """The state folder of a daemon that governed a fully loaded x86-amd with `adaptive` for 5 s,
    and its loop."""
    folder = tmp_path / "state"
    first = Simulator(PROFILES["x86-amd"], tmp_path / "board1")
    first.build()
    loop, clock, _ = make_loop(
        first.root, LoopSettings(policy="adaptive"), power_map=PowerMapStore(folder)
    )
    run_for(loop, clock, 5.0, first)
    return folder, loop


def test_a_restarted_daemon_starts_from_what_it_learned(tmp_path: Path) -> None:
    """x86-amd: every core at 2100 MHz draws ~17.7 W under full load, over 12 W. The first
    daemon learns it the hard way; the second, on an idle board, leaves 2100 MHz at once."""
    folder, loop = learned_on_x86_amd(tmp_path)
    assert (folder / FILENAME).exists()
    top = tuple(sorted(loop.policy.state.levels[-1].caps_mhz))
    assert PowerMapStore(folder).load(loop._power_fingerprint())[top] > 12.0

    for remembered, leaves in ((PowerMapStore(folder), True), (None, False)):
        again = Simulator(
            PROFILES["x86-amd"], tmp_path / f"board-{leaves}", load=LoadSchedule("idle")
        )
        again.build()
        loop, clock, events = make_loop(
            again.root, LoopSettings(policy="adaptive"), power_map=remembered
        )
        run_for(loop, clock, 2.0, again)
        lowered = [e for e in events if e.kind == "governor" and e.data["action"] == "lower"]
        assert bool(lowered) is leaves
        if leaves:
            assert "learned peak" in lowered[0].data["reason"]


def test_a_policy_taken_over_at_a_reload_knows_the_learned_power(tmp_path: Path) -> None:
    """A daemon started with `hysteresis` and reloaded with `adaptive` (x86-amd, idle): the
    adaptive policy starts from the peaks the file holds, as at a start, and leaves 2100 MHz."""
    folder, loop = learned_on_x86_amd(tmp_path)
    learned = PowerMapStore(folder).load(loop._power_fingerprint())
    again = Simulator(PROFILES["x86-amd"], tmp_path / "board2", load=LoadSchedule("idle"))
    again.build()
    loop, clock, events = make_loop(again.root, power_map=PowerMapStore(folder))
    run_for(loop, clock, 1.0, again)
    assert loop.policy.learned_w() is None  # the seed rule learns nothing
    loop.request_reload(LoopSettings(policy="adaptive"))
    run_for(loop, clock, 1.0, again)
    known = loop.policy.learned_w()
    assert known is not None and learned.items() <= known.items()
    lowered = [e for e in events if e.kind == "governor" and e.data["action"] == "lower"]
    assert lowered and "learned peak" in lowered[0].data["reason"]


def test_a_cut_lands_on_the_highest_level_whose_known_peak_fits() -> None:
    """Back at a level with a known peak under the same load, the cut trusts each lower level's
    own peak (17.7 W now, as known: 1700 MHz's 10.1 W fits) instead of scaling the power now by
    the plain ratio (17.7 x 1700 / 2100 = 14.3 W: it would go to the floor)."""
    policy = AdaptivePolicy()
    known = AdaptiveState(level=2, learned_w=((2, 17.7, 0.0), (1, 10.1, 0.0), (0, 6.0, 0.0)))
    verdict, state = policy.decide(known, Readings(60.0, 17.7, metered=True), 10.0, LEVELS)
    assert verdict.action is Action.LOWER and state.level == 1
    # Drawing half as much again as the peak known here: the lower peaks are scaled with it.
    heavier = Readings(60.0, 17.7 * 1.5, metered=True)
    known = AdaptiveState(level=2, learned_w=((2, 17.7, 0.0), (1, 10.1, 0.0), (0, 6.0, 0.0)))
    verdict, state = policy.decide(known, heavier, 10.0, LEVELS)
    assert verdict.action is Action.LOWER and state.level == 0


def test_a_cut_on_a_learned_peak_trusts_only_levels_with_a_peak_of_their_own() -> None:
    """Idle at a level known to draw 17.7 W: 1700 MHz was never measured, and 4 W now says
    nothing about it under load, so the cut goes to the level whose own peak fits."""
    policy = AdaptivePolicy()
    known = AdaptiveState(level=2, learned_w=((2, 17.7, 0.0), (0, 6.0, 0.0)))
    verdict, state = policy.decide(known, Readings(60.0, 4.0, metered=True), 10.0, LEVELS)
    assert verdict.action is Action.LOWER and state.level == 0


def test_a_reloaded_policy_keeps_what_it_learned_about_power() -> None:
    driver = PolicyDriver(AdaptiveGovernor())
    driver.adopt(_controls())
    top = caps_key(driver.state.levels[-1])
    driver.seed({top: 17.7}, 0.0)
    driver.reload(AdaptiveGovernor(AdaptivePolicy(margin_c=1.0)))
    assert driver.learned_w() == {top: 17.7}


def _controls() -> dict[str, DomainControl]:
    table = tuple(khz * 1000 for khz in (1400, 1700, 2100))
    domain = FrequencyDomain("policy0", "cpufreq", Path("/sys/x"), table[0], table[-1], table)
    return {"policy0": DomainControl(domain, 1400.0, 2100.0, 2100.0)}


def test_the_warm_benchmark_starts_from_the_first_runs_learned_power() -> None:
    """x86-intel, half busy then fully busy at 75 s: a fresh governor crosses 12 W for one meter
    window at the step; restarted from the first run's learned power it has left the top level
    at start and does not."""
    sys.path.insert(0, str(PROJECT / "bench"))
    import quality  # bench/quality.py

    case = quality.Case("x86-intel", "load-step", minutes=2.5)
    (fresh,) = quality.sweep_seeds([case], ("adaptive",))
    (warm,) = quality.sweep_seeds([case], ("adaptive",), warm=True)
    assert fresh["governor"] == "adaptive" and warm["governor"] == "adaptive, warm"
    assert fresh["seconds_over_power_limit_after_1s"] > 0
    assert warm["seconds_over_power_limit_after_1s"] == 0
