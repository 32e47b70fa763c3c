"""The read primitive: tolerant, logged once per outage, never raising into the caller."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sensors.sysfs import Attribute, device_name, parse_int, read_line, resolve


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_parse_int_reads_kernel_decimal(value: int) -> None:
    assert parse_int(f"{value}\n") == value


@given(st.text())
def test_parse_int_never_raises(text: str) -> None:
    result = parse_int(text)
    assert result is None or isinstance(result, int)


@pytest.mark.parametrize(
    "text", ["", "\n", "N/A\n", "4l000\n", "0x10\n", "12.5\n", "\x00\x7f#err\n"]
)
def test_parse_int_rejects_non_decimal(text: str) -> None:
    assert parse_int(text) is None


def test_read_line_strips_newline_and_device_tree_nul(tmp_path: Path) -> None:
    (tmp_path / "model").write_bytes(b"Radxa ROCK 5B\x00")
    (tmp_path / "type").write_text("cpu-thermal\n")
    (tmp_path / "empty").write_text("\n")
    assert read_line(tmp_path / "model") == "Radxa ROCK 5B"
    assert read_line(tmp_path / "type") == "cpu-thermal"
    assert read_line(tmp_path / "empty") is None
    assert read_line(tmp_path / "missing") is None


def test_attribute_logs_an_outage_once_and_its_recovery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "temp"
    attr = Attribute(path)
    caplog.set_level(logging.INFO, logger="mcpd.sensors")
    for _ in range(5):
        assert attr.read_int() is None
    assert attr.gone
    path.write_text("garbage\n")
    assert attr.read_int() is None
    assert not attr.gone and attr.failing
    path.write_text("41468\n")
    assert attr.read_int() == 41468
    assert not attr.failing
    path.unlink()
    assert attr.read_int() is None
    messages = [record.getMessage() for record in caplog.records]
    assert len([m for m in messages if "unavailable (ENOENT)" in m]) == 2
    assert len([m for m in messages if "readable again" in m]) == 1
    assert not [m for m in messages if "non-numeric" in m], (
        "a change of failure within an outage is not re-logged"
    )


def test_device_name_of_hwmon_and_iio(tmp_path: Path) -> None:
    hwmon = tmp_path / "devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon3"
    iio = tmp_path / "devices/7000c400.i2c/i2c-6/6-0040/iio:device0"
    hwmon.mkdir(parents=True)
    iio.mkdir(parents=True)
    (tmp_path / "hwmon3").symlink_to(hwmon)
    assert device_name(tmp_path / "hwmon3") == "1-0040"
    assert device_name(iio) == "6-0040"


def test_kept_descriptor_follows_replacement_and_removal(tmp_path: Path) -> None:
    """The attribute stays open between reads; a file replaced by rename (the simulator) or
    removed (hotplug) must still be noticed."""
    path = tmp_path / "temp"
    path.write_text("41000\n")
    attr = Attribute(path)
    assert attr.read_int() == 41000
    path.write_text("42000\n")  # rewritten in place, as sysfs regenerates an attribute
    assert attr.read_int() == 42000
    replacement = tmp_path / ".temp.new"
    replacement.write_text("43000\n")
    replacement.replace(path)
    assert attr.read_int() == 43000
    path.unlink()
    assert attr.read_int() is None and attr.gone
    path.write_text("44000\n")
    assert attr.read_int() == 44000 and not attr.gone
    attr.close()


def test_resolve_is_realpath_in_three_system_calls(tmp_path: Path) -> None:
    """Class entries are relative links into sys/devices; a FIFO is never opened (no blocking)."""
    device = tmp_path / "sys/devices/virtual/thermal/thermal_zone0"
    device.mkdir(parents=True)
    (device / "temp").write_text("41000\n")
    os.mkfifo(device / "fifo")
    (tmp_path / "sys/class/thermal").mkdir(parents=True)
    (tmp_path / "sys/class/thermal/thermal_zone0").symlink_to(
        "../../devices/virtual/thermal/thermal_zone0"
    )
    (tmp_path / "dangling").symlink_to("nowhere/at/all")
    for path in (
        tmp_path / "sys/class/thermal/thermal_zone0/temp",
        tmp_path / "sys/class/thermal/thermal_zone0/fifo",
        tmp_path / "sys/class/thermal/thermal_zone0/../thermal_zone0",
        tmp_path / "sys/class/thermal/thermal_zone0/missing",
        tmp_path / "dangling",
    ):
        assert resolve(path) == os.path.realpath(path), path
    assert resolve(tmp_path / "sys/class/thermal/thermal_zone0/temp") == str(device / "temp")
