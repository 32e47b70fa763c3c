"""The status fields this policy work adds, from the snapshot to the document and /metrics."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mcpd import status
from mcpd.governor.thermal_forecast import headroom
from mcpd.serving import metrics
from tests.support.mqtt_status import placement
from tests.support.snapshots import snapshot

OTHER_PARTS: tuple[status.DaemonDoc, status.LoopDoc, status.ServingDoc] = (
    {
        "pid": 1,
        "cpu_percent": 0.5,
        "rss_mb": 30.0,
        "uptime_s": 1.0,
        "version": "0",
        "scheduling": "normal",
    },
    {"sample_lateness": None, "sample_to_write": None},
    {"pid": None, "state": "starting", "restarts": 0, "last_exit": None, "config_error": None},
)


def test_headroom_is_androids_normalization() -> None:
    assert headroom(85.0, 85.0) == 1.0
    assert headroom(55.0, 85.0) == 0.0
    assert headroom(79.0, 85.0) == pytest.approx(0.8)
    assert headroom(91.0, 85.0) == pytest.approx(1.2)  # past the threshold: above 1
    assert headroom(None, 85.0) is None


def test_document_and_metrics_carry_headroom_policy_and_external_changes() -> None:
    document = status.document(
        snapshot(headroom=0.8, external_cap_changes=2, policy="adaptive"),
        {},
        *OTHER_PARTS,
        placement=placement(),
    )
    assert document["thermal"] == {"headroom": 0.8, "seconds_to_throttle": None}
    governor = document["governor"]
    assert (governor["policy"], governor["external_cap_changes"]) == ("adaptive", 2)
    lines = metrics.Exposition(lambda: document, dict).render("")[0].decode().splitlines()
    assert "mcpd_thermal_headroom_ratio 0.8" in lines
    assert "mcpd_governor_external_cap_changes_total 2.0" in lines
    unknown = status.document(snapshot(temperature_c=None), {}, *OTHER_PARTS, placement=placement())
    assert unknown["thermal"] == {"headroom": None, "seconds_to_throttle": None}
    heading = status.document(
        snapshot(seconds_to_throttle=12.345), {}, *OTHER_PARTS, placement=placement()
    )
    assert heading["thermal"]["seconds_to_throttle"] == 12.3
    text = metrics.Exposition(lambda: unknown, dict).render("")[0].decode()
    assert not [x for x in text.splitlines() if x.startswith("mcpd_thermal_headroom")]


def test_daemon_stats_measure_this_process() -> None:
    stats = status.DaemonStats("fifo 10")
    busy_until = time.thread_time() + 0.3
    while time.thread_time() < busy_until:
        pass
    measured = stats()
    assert measured["cpu_percent"] > 30
    vm_rss_kb = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    assert measured["rss_mb"] == pytest.approx(vm_rss_kb / 1024, rel=0.05)
    assert (measured["pid"], measured["scheduling"]) == (os.getpid(), "fifo 10")
