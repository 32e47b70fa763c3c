"""The cooling's health kept across restarts (mcpd/governor/cooling_store.py), and the watch
that keeps it for the board it runs on (mcpd/governor/cooling.py)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from mcpd.config import CoolingSection
from mcpd.events import EventBus
from mcpd.governor import cooling_store
from mcpd.governor.cooling import CoolingWatch
from mcpd.governor.cooling_fit import STEP_S
from mcpd.governor.cooling_health import Estimate, Health, Run
from mcpd.governor.cooling_store import BOARDS, FILENAME, CoolingStore, key
from tests.governor.test_cooling_fit import board, bursts

BOARD = {
    "platform": "jetson-orin",
    "model": "NVIDIA Jetson Orin Nano Developer Kit",
    "temperatures": ["cpu-thermal"],
    "power": "meter",
    "meters": ["VDD_IN"],
    "coefficients": {},
}
KEY = key(BOARD)
OTHER = key({**BOARD, "power": "estimate", "meters": ["estimate"]})
OFFSET = 1.7e9
"""Unix time less the loop's clock."""
BASE = Estimate(0.0, 7200.0, 6.32, 35.5, 8.4)
HEALTH = Health(
    baseline=BASE,
    recent=(Estimate(9000.0, 10800.0, 9.9, 36.0, 0.1), Estimate(10800.0, 12600.0, 10.0, 36.2, 0.0)),
    run=Run(True, 9000.0, 2),
)


def test_the_health_comes_back_by_fingerprint(tmp_path: Path) -> None:
    store = CoolingStore(tmp_path / "state")
    assert store.keep([(KEY, HEALTH), (OTHER, Health(learning=(BASE,)))], OFFSET, now=0.0)
    assert (tmp_path / "state" / FILENAME).stat().st_mode & 0o777 == 0o644
    saved = json.loads((tmp_path / "state" / FILENAME).read_text())
    assert saved["boards"][0]["fingerprint"] == BOARD
    assert saved["boards"][0]["baseline"]["end"] == OFFSET + 7200.0  # Unix time
    # A restart: the loop's clock has another origin; the times are the same moments.
    assert CoolingStore(tmp_path / "state").load(OFFSET + 50.0) == {
        KEY: Health(
            baseline=Estimate(-50.0, 7150.0, 6.32, 35.5, 8.4),
            recent=(
                Estimate(8950.0, 10750.0, 9.9, 36.0, 0.1),
                Estimate(10750.0, 12550.0, 10.0, 36.2, 0.0),
            ),
            run=Run(True, 8950.0, 2),
        ),
        OTHER: Health(learning=(Estimate(-50.0, 7150.0, 6.32, 35.5, 8.4),)),
    }
    assert CoolingStore(tmp_path / "nowhere").load(OFFSET) == {}
    many = [(key({**BOARD, "model": str(n)}), HEALTH) for n in range(BOARDS + 2)]
    assert store.keep(many, OFFSET, now=100.0)
    assert list(CoolingStore(tmp_path / "state").load(OFFSET)) == [b for b, _ in many[:BOARDS]]


def watch(folder: Path, clock: list[float]) -> CoolingWatch:
    return CoolingWatch(
        EventBus(),
        CoolingStore(folder),
        CoolingSection(),
        lambda: clock[0],
        lambda: OFFSET + clock[0],
    )


def feed_window(cooling: CoolingWatch, clock: list[float], start: float) -> None:
    """A half hour of a two-mass board under bursts, one reading of each every step, from
    `start`; then the status path's look."""
    temps, powers = board(bursts)
    for step, (celsius, watts) in enumerate(zip([*temps, 0.0], [*powers, 0.0], strict=True)):
        clock[0] = start + step * STEP_S
        cooling.add_temperature(clock[0], celsius)
        cooling.add_power(clock[0], watts)
    cooling.refresh(clock[0])


def test_the_watch_takes_the_baseline_of_its_board_and_keeps_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A governing sensor gone for a while changes the fingerprint: the board as it was keeps
    its baseline, in memory and in the file, and has it back when the sensor is."""
    assert CoolingStore(tmp_path).keep([(KEY, HEALTH)], OFFSET, now=0.0)
    clock = [0.0]
    cooling = watch(tmp_path, clock)
    cooling.collector.begin(KEY)
    with caplog.at_level(logging.INFO, logger="mcpd.governor.cooling"):
        cooling.refresh(clock[0])
    assert cooling.health == HEALTH
    assert f"cooling: baseline 6.32 °C/W from {tmp_path / FILENAME}" in caplog.text
    cooling.collector.begin(OTHER)
    cooling.refresh(clock[0])
    assert cooling.health == Health() and cooling.status().state == "learning"
    feed_window(cooling, clock, 20_000.0)  # a window under the other sensors
    assert len(cooling.health.learning) == 1 and cooling.windows == 1
    saved = CoolingStore(tmp_path).load(OFFSET)
    assert list(saved) == [OTHER, KEY] and saved[KEY] == HEALTH
    (learned,) = saved[OTHER].learning
    assert learned.r_c_per_w == pytest.approx(cooling.health.learning[0].r_c_per_w, abs=1e-4)
    cooling.collector.begin(KEY)
    cooling.refresh(clock[0])
    assert cooling.health == HEALTH and cooling.status().state == "rising"


def test_the_file_keeps_the_most_recent_first_across_restarts(tmp_path: Path) -> None:
    third = key({**BOARD, "temperatures": ["tj-thermal"]})
    kept = [(KEY, HEALTH), (OTHER, Health(learning=(BASE,))), (third, Health())]
    assert CoolingStore(tmp_path).keep(kept, OFFSET, now=0.0)
    clock = [0.0]
    cooling = watch(tmp_path, clock)
    cooling.collector.begin(KEY)
    feed_window(cooling, clock, 20_000.0)
    assert cooling.windows == 1
    assert list(CoolingStore(tmp_path).load(OFFSET)) == [KEY, OTHER, third]


def test_a_file_of_other_boards_only_is_named_and_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert CoolingStore(tmp_path).keep([(OTHER, HEALTH)], OFFSET, now=0.0)
    cooling = watch(tmp_path, [0.0])
    cooling.collector.begin(KEY)
    with caplog.at_level(logging.WARNING):
        cooling.refresh(0.0)
    assert cooling.health == Health()
    assert f"cooling {tmp_path / FILENAME}: learned on another board" in caplog.text


def test_saved_at_most_once_a_minute_and_only_when_changed(tmp_path: Path) -> None:
    store = CoolingStore(tmp_path)
    path = tmp_path / FILENAME
    assert store.keep([(KEY, Health(learning=(BASE,)))], OFFSET, now=0.0)
    os.utime(path, ns=(0, 0))
    assert store.keep([(KEY, Health(learning=(BASE,)))], OFFSET, now=30.0)  # nothing new
    assert not store.keep([(KEY, HEALTH)], OFFSET, now=40.0)  # new, within the minute: later
    assert path.stat().st_mtime_ns == 0
    assert store.keep([(KEY, HEALTH)], OFFSET, now=60.0)
    assert store.load(OFFSET) == {KEY: HEALTH}


ENTRY = b'{"fingerprint": FP, "baseline": null, "learning": [], "recent": [], "run": null}'


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"[" * 1000, "nested deeper than 32 levels"),
        (b'{"format": 2}', "not a format-1 cooling file"),
        (b'{"format": 1, "boards": {}}', '"boards" is not a list of at most 4'),
        (b'{"format": 1, "boards": [{"baseline": null}]}', "boards[0] has no fingerprint"),
        (
            b'{"format": 1, "boards": [{"fingerprint": FP, "baseline": {"start": 0, "end": 1,'
            b' "r_c_per_w": -6, "tau_s": 30, "intercept_c": 9}}]}',
            "boards[0].baseline.r_c_per_w -6.0 is not in (0, 1000)",
        ),
        (
            b'{"format": 1, "boards": [ENTRY, {"fingerprint": FP, "baseline": null,'
            b' "learning": [], "recent": [], "run": {"above": 1, "start": 0, "windows": 2}}]}',
            "boards[1].run.above is not true or false",
        ),
        (
            b'{"format": 1, "boards": [{"fingerprint": FP, "baseline": null,'
            b' "learning": [1, 2, 3, 4], "recent": []}]}',
            "boards[0].learning is not a list of at most 3",
        ),
        (
            b'{"format": 1, "boards": [{"fingerprint": FP, "baseline": null, "learning": [],'
            b' "recent": [], "run": null, "degraded_since": "yesterday"}]}',
            "boards[0].degraded_since 'yesterday' is not a number",
        ),
    ],
)
def test_a_file_that_is_not_what_mcpd_writes_is_named_and_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, problem: str
) -> None:
    content = content.replace(b"ENTRY", ENTRY).replace(b"FP", json.dumps(BOARD).encode())
    (tmp_path / FILENAME).write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert CoolingStore(tmp_path).load(OFFSET) == {}
    assert problem in caplog.text and str(tmp_path / FILENAME) in caplog.text
    store = CoolingStore(tmp_path)
    assert store.keep([(KEY, HEALTH)], OFFSET, now=0.0)  # replaced at the next save
    assert CoolingStore(tmp_path).load(OFFSET) == {KEY: HEALTH}


def test_a_planted_link_is_neither_read_nor_written_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "elsewhere"
    planted = cooling_store.render([(KEY, HEALTH)], OFFSET)
    target.write_bytes(planted)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / FILENAME).symlink_to(target)
    store = CoolingStore(tmp_path / "state")
    with caplog.at_level(logging.WARNING):
        assert store.load(OFFSET) == {}
    assert "symlink" in caplog.text
    assert store.keep([(KEY, Health(learning=(BASE,)))], OFFSET, now=0.0)
    assert not (tmp_path / "state" / FILENAME).is_symlink()  # replaced, not followed
    assert target.read_bytes() == planted


def test_a_folder_that_cannot_be_written_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state").write_text("a file where the folder should be\n")
    store = CoolingStore(tmp_path / "state")
    with caplog.at_level(logging.WARNING):
        assert not store.keep([(KEY, HEALTH)], OFFSET, now=0.0)
        assert not store.keep([(KEY, HEALTH)], OFFSET, now=100.0)
    assert caplog.text.count("cooling baseline not saved") == 1
