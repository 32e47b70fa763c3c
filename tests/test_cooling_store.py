"""The cooling's health kept across restarts (mcpd/governor/cooling_store.py)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from mcpd.governor import cooling_store
from mcpd.governor.cooling_health import Estimate, Health, Run
from mcpd.governor.cooling_store import FILENAME, CoolingStore

BOARD = {
    "platform": "jetson-orin",
    "model": "NVIDIA Jetson Orin Nano Developer Kit",
    "temperatures": ["cpu-thermal"],
    "power": "meter",
    "meters": ["VDD_IN"],
    "coefficients": {},
}
OFFSET = 1.7e9
"""Unix time less the loop's clock."""
BASE = Estimate(0.0, 7200.0, 6.32, 35.5, 8.4)
HEALTH = Health(
    baseline=BASE,
    recent=(Estimate(9000.0, 10800.0, 9.9, 36.0, 0.1), Estimate(10800.0, 12600.0, 10.0, 36.2, 0.0)),
    run=Run(True, 9000.0, 2),
)


def test_the_health_comes_back_on_the_same_board_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CoolingStore(tmp_path / "state")
    assert store.keep(BOARD, HEALTH, OFFSET, now=0.0)
    assert (tmp_path / "state" / FILENAME).stat().st_mode & 0o777 == 0o644
    saved = json.loads((tmp_path / "state" / FILENAME).read_text())
    assert saved["baseline"]["end"] == OFFSET + 7200.0  # Unix time
    # A restart: the loop's clock has another origin; the times are the same moments.
    assert CoolingStore(tmp_path / "state").load(BOARD, OFFSET + 50.0) == Health(
        baseline=Estimate(-50.0, 7150.0, 6.32, 35.5, 8.4),
        recent=(
            Estimate(8950.0, 10750.0, 9.9, 36.0, 0.1),
            Estimate(10750.0, 12550.0, 10.0, 36.2, 0.0),
        ),
        run=Run(True, 8950.0, 2),
    )
    estimated = {**BOARD, "power": "estimate", "meters": ["estimate"]}
    with caplog.at_level(logging.WARNING):
        assert CoolingStore(tmp_path / "state").load(estimated, OFFSET) == Health()
    assert "learned on another board, governing sensor or power source" in caplog.text
    assert str(tmp_path / "state" / FILENAME) in caplog.text
    assert CoolingStore(tmp_path / "nowhere").load(BOARD, OFFSET) == Health()


def test_saved_at_most_once_a_minute_and_only_when_changed(tmp_path: Path) -> None:
    store = CoolingStore(tmp_path)
    path = tmp_path / FILENAME
    assert store.keep(BOARD, Health(learning=(BASE,)), OFFSET, now=0.0)
    os.utime(path, ns=(0, 0))
    assert store.keep(BOARD, Health(learning=(BASE,)), OFFSET, now=30.0)  # nothing new
    assert not store.keep(BOARD, HEALTH, OFFSET, now=40.0)  # new, within the minute: later
    assert path.stat().st_mtime_ns == 0
    assert store.keep(BOARD, HEALTH, OFFSET, now=60.0)
    assert store.load(BOARD, OFFSET) == HEALTH


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"[" * 1000, "nested deeper than 32 levels"),
        (b'{"format": 2}', "not a format-1 cooling file"),
        (b'{"format": 1, "fingerprint": FP, "baseline": 3}', "baseline is not an object"),
        (
            b'{"format": 1, "fingerprint": FP, "baseline": {"start": 0, "end": 1, "r_c_per_w": -6,'
            b' "tau_s": 30, "intercept_c": 9}}',
            "baseline.r_c_per_w -6.0 is not in (0, 1000)",
        ),
        (
            b'{"format": 1, "fingerprint": FP, "baseline": null, "learning": [], "recent": [],'
            b' "run": {"above": 1, "start": 0, "windows": 2}}',
            "run.above is not true or false",
        ),
        (
            b'{"format": 1, "fingerprint": FP, "baseline": null, "learning": [1, 2, 3, 4],'
            b' "recent": []}',
            '"learning" is not a list of at most 3',
        ),
        (
            b'{"format": 1, "fingerprint": FP, "baseline": null, "learning": [], "recent": [],'
            b' "run": null, "degraded_since": "yesterday"}',
            "cooling.degraded_since 'yesterday' is not a number",
        ),
    ],
)
def test_a_file_that_is_not_what_mcpd_writes_is_named_and_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, problem: str
) -> None:
    (tmp_path / FILENAME).write_bytes(content.replace(b"FP", json.dumps(BOARD).encode()))
    with caplog.at_level(logging.WARNING):
        assert CoolingStore(tmp_path).load(BOARD, OFFSET) == Health()
    assert problem in caplog.text and str(tmp_path / FILENAME) in caplog.text
    store = CoolingStore(tmp_path)
    assert store.keep(BOARD, HEALTH, OFFSET, now=0.0)  # replaced at the next save
    assert CoolingStore(tmp_path).load(BOARD, OFFSET) == HEALTH


def test_a_planted_link_is_neither_read_nor_written_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "elsewhere"
    planted = cooling_store.render(BOARD, HEALTH, OFFSET)
    target.write_bytes(planted)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / FILENAME).symlink_to(target)
    store = CoolingStore(tmp_path / "state")
    with caplog.at_level(logging.WARNING):
        assert store.load(BOARD, OFFSET) == Health()
    assert "symlink" in caplog.text
    assert store.keep(BOARD, Health(learning=(BASE,)), OFFSET, now=0.0)
    assert not (tmp_path / "state" / FILENAME).is_symlink()  # replaced, not followed
    assert target.read_bytes() == planted


def test_a_folder_that_cannot_be_written_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state").write_text("a file where the folder should be\n")
    store = CoolingStore(tmp_path / "state")
    with caplog.at_level(logging.WARNING):
        assert not store.keep(BOARD, HEALTH, OFFSET, now=0.0)
        assert not store.keep(BOARD, HEALTH, OFFSET, now=100.0)
    assert caplog.text.count("cooling baseline not saved") == 1
