"""Floods on the topics the governor listens to, against the real governor on a simulated board
(issue 26, item 3).

80 000 malformed commands in 8 s used to take the governor from 30 MB to 600 MB, make its control
loop 678 ms late, write a log line and queue an answer for each, and stop its telemetry: paho read
the flood in front of the telemetry's acknowledgements, so the in-flight window filled and stayed
full. Home Assistant's status topic did the same with `online`, each one queueing every discovery
config again.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpd.telemetry import inbound, mqtt_client
from tests.support.daemon import DaemonProcess, simulated
from tests.support.mqtt_broker import Flood, Mosquitto, mosquitto_binary, recording
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")

TELEMETRY = "mcpd/sim1/telemetry"
REPLIES = "mcpd/sim1/cmd/+/reply"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"process {pid} has no VmRSS")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with Mosquitto(tmp_path / "broker") as broker:
        yield broker


@pytest.fixture
def governor(broker: Mosquitto, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    config = tmp_path / "mcpd.toml"
    config.write_text(
        f"""
[mqtt]
enabled = true
host = "127.0.0.1"
port = {broker.port}
device_id = "sim1"
telemetry_ms = 100
commands_enabled = true
homeassistant_discovery = true
"""
    )
    board = simulated("jetson-orin-nano", tmp_path / "board")
    with DaemonProcess(config, *board, log=tmp_path / "daemon.log") as daemon:
        yield daemon.process


@pytest.mark.parametrize(
    ("topic", "payload"),
    [("mcpd/sim1/cmd/pause", b"{not json"), ("homeassistant/status", b"online")],
    ids=["commands", "home assistant status"],
)
def test_a_flood_costs_no_memory_no_log_and_no_telemetry(
    broker: Mosquitto,
    governor: subprocess.Popen[bytes],
    tmp_path: Path,
    topic: str,
    payload: bytes,
) -> None:
    log = tmp_path / "daemon.log"
    with recording(broker, TELEMETRY, REPLIES) as recorder:
        recorder.wait_for(TELEMETRY, 3, timeout=30)
        rss_before, log_before = rss_mb(governor.pid), log.stat().st_size
        telemetry_before = len(recorder.on(TELEMETRY))
        wanted = telemetry_before + mqtt_client.WINDOW + 5
        started = time.monotonic()
        with Flood(broker, topic, payload) as flood:

            def through() -> bool:
                if len(recorder.on(TELEMETRY)) >= wanted:
                    return True
                grown = rss_mb(governor.pid) - rss_before
                assert grown < 100, f"governor memory +{grown:.0f} MB in the flood"
                return False

            wait_until(through, 30, "telemetry through the flood")
        flooded_s = time.monotonic() - started
        # Telemetry left as it was made: its acknowledgements came back through the flood, so the
        # spool never held many (it filled towards the in-flight window, 1 more per sample, while
        # paho read the flood in front of them).
        during = recorder.on(TELEMETRY)[telemetry_before:]
        assert max(m.json()["spool"]["queued"] for m in during) < mqtt_client.WINDOW // 2
        assert flood.sent > 100 * (inbound.BURST + flooded_s * inbound.RATE_PER_S)
        assert rss_mb(governor.pid) - rss_before < 20
        replies = recorder.on("mcpd/sim1/cmd/pause/reply")
        assert len(replies) <= inbound.BURST + math.ceil(flooded_s * inbound.RATE_PER_S)
        assert all(not reply.json()["ok"] for reply in replies)
    lines = log.read_bytes()[log_before:].decode().splitlines()
    said = [line for line in lines if "mcpd.telemetry" in line]
    assert 1 <= len(said) <= 3, said  # the flood, and for commands rejected and over the rate
    assert governor.poll() is None
