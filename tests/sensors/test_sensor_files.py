"""Sensor files that are not what a kernel serves: they never block the loop, never recover into a
stale descriptor, and values no driver prints are faults."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TypeVar

import pytest

from sensors.sysfs import Attribute, parse_int, read_line
from tests.support.boards import POLICY4
from tests.support.fakesys import FakeSysfs
from tests.support.loop import ZONE, board_with_meter, cap, make_loop, run_for, set_temp
from tests.support.waiting import within

T = TypeVar("T")


@pytest.mark.parametrize(
    "text", ["-0\n", "+5\n", "007\n", "1_000\n", "4 2\n", "-\n", "9" * 25 + "\n", "٤٢\n"]
)
def test_values_no_driver_prints_are_rejected(text: str) -> None:
    assert parse_int(text) is None


def test_a_fifo_is_a_fault_that_never_blocks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "temp"
    os.mkfifo(path)
    attr = Attribute(path)
    with caplog.at_level(logging.WARNING, "mcpd.sensors"):
        assert within(30, attr.read_int) is None
    assert attr.failing and not attr.gone
    assert "unavailable (not a regular file (a FIFO))" in caplog.text
    assert within(30, lambda: read_line(path)) is None  # discovery reads names the same way


def test_endless_data_is_a_fault_and_recovers_when_the_real_file_returns(tmp_path: Path) -> None:
    path = tmp_path / "temp"
    path.write_text("41000\n")
    attr = Attribute(path)
    assert attr.read_int() == 41000
    path.unlink()
    path.symlink_to("/dev/zero")
    assert attr.read_int() is None and attr.failing
    path.unlink()
    path.write_text("42000\n")
    assert attr.read_int() == 42000 and not attr.failing
    path.write_bytes(b"4" * 8192)  # a regular file longer than any attribute
    assert attr.read_int() is None and attr.failing
    path.write_text("43000\n")
    assert attr.read_int() == 43000
    attr.close()


def test_a_fault_is_logged_once_per_episode_across_re_discovery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "temp"
    path.write_text("garbage\n")
    caplog.set_level(logging.INFO, logger="mcpd.sensors")
    for _ in range(3):  # re-discovery makes a new Attribute for the same file each time
        assert Attribute(path).read_int() is None
    path.write_text("41000\n")
    assert Attribute(path).read_int() == 41000
    assert Attribute(path).read_int() == 41000
    path.write_text("garbage\n")
    assert Attribute(path).read_int() is None
    messages = [record.getMessage() for record in caplog.records]
    assert len([m for m in messages if "unavailable" in m]) == 2  # two episodes
    assert len([m for m in messages if "readable again" in m]) == 1


def test_a_fifo_in_place_of_the_temperature_keeps_the_loop_deciding(fake: FakeSysfs) -> None:
    board_with_meter(fake, 80.0, 5.0)
    loop, clock, events = make_loop(fake.root)
    run_for(loop, clock, 1.0)
    assert cap(fake, POLICY4) == 2400000
    (fake.root / ZONE).unlink()
    os.mkfifo(fake.root / ZONE)
    within(30, lambda: run_for(loop, clock, 3.0))
    assert loop.snapshot.state == "fail-safe"
    assert cap(fake, POLICY4) < 2400000
    assert any("temperature unknown" in e.message for e in events)
    (fake.root / ZONE).unlink()
    set_temp(fake, 60.0)
    within(30, lambda: run_for(loop, clock, 1.0))
    assert loop.snapshot.state == "raising"


def test_a_sensor_linked_to_dev_zero_from_the_start_recovers_when_the_file_returns(
    fake: FakeSysfs,
) -> None:
    board_with_meter(fake, 80.0, 5.0)
    (fake.root / ZONE).unlink()
    (fake.root / ZONE).symlink_to("/dev/zero")
    loop, clock, _ = make_loop(fake.root)
    run_for(loop, clock, 2.0)
    assert loop.snapshot.state == "fail-safe"
    (fake.root / ZONE).unlink()
    set_temp(fake, 80.0)
    run_for(loop, clock, 11.0)  # the periodic rescan of a fake tree opens the real file
    assert loop.snapshot.state == "holding"
    assert loop.snapshot.temperature_c == 80.0


def test_the_memory_of_fault_episodes_is_bounded(tmp_path: Path) -> None:
    from sensors import sysfs

    for index in range(sysfs._MAX_FAILURES + 10):
        Attribute(tmp_path / f"gone{index}").read_int()  # hwmon renumbered again and again
    assert len(sysfs._FAILURES) == sysfs._MAX_FAILURES
    assert str(tmp_path / f"gone{sysfs._MAX_FAILURES + 9}") in sysfs._FAILURES
