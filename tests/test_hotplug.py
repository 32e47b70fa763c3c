"""Hotplug through real libudev: umockdev provides a testbed /sys and emits the uevents."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import PROJECT


@pytest.mark.skipif(
    shutil.which("umockdev-wrapper") is None, reason="umockdev is not installed (Debian: umockdev)"
)
def test_udev_add_and_remove_trigger_rediscovery() -> None:
    process = subprocess.run(
        ["umockdev-wrapper", sys.executable, "-m", "tests.umockdev_hotplug"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 0, process.stderr
    result = json.loads(process.stdout)
    assert result == {
        "before": [],
        "quiet": False,
        "add_seen": True,
        "after_add": {"VDD_IN": 6.0},
        "temperature": 45.0,
        "remove_seen": True,
        "after_remove": [],
    }
