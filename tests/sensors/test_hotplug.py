"""Hotplug through real libudev: umockdev provides a testbed /sys and emits the uevents."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import PROJECT

UMOCKDEV = pytest.mark.skipif(
    shutil.which("umockdev-wrapper") is None, reason="umockdev is not installed (Debian: umockdev)"
)


def under_umockdev(*args: str) -> Any:
    process = subprocess.run(
        ["umockdev-wrapper", sys.executable, "-m", "tests.support.umockdev_hotplug", *args],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout)


@UMOCKDEV
def test_udev_add_and_remove_trigger_rediscovery() -> None:
    result = under_umockdev()
    assert result == {
        "before": [],
        "quiet": False,
        "add_seen": True,
        "after_add": {"VDD_IN": 6.0},
        "temperature": 45.0,
        "remove_seen": True,
        "after_remove": [],
    }


@UMOCKDEV
def test_a_udev_storm_costs_one_rediscovery_a_second_and_a_few_log_lines() -> None:
    """600 add/remove events over 3 s of the loop's clock (issue 26): before, a re-discovery at
    every tick that had an event (thirty) and a log line per event (six hundred), and the whole
    queue read in one go however long it was."""
    result = under_umockdev("storm")
    assert result["rediscoveries"] == [1.0, 2.0, 3.0]  # the start's discovery counts as one
    assert result["lines"] == 2, result["said"]  # an add and a remove, said once in 10 s
    assert "more since, not logged" not in result["said"][0]
    assert result["bounded"]  # 100 queued events: some are left for the next tick
