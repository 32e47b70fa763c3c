"""The real daemon on a simulated board, publishing to a real broker: status, Will, commands."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PROJECT
from tests.mqtt_broker import Mosquitto, mosquitto_binary, recording

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")

STATUS = "mcpd/sim1/status"
TELEMETRY = "mcpd/sim1/telemetry"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with Mosquitto(tmp_path / "broker") as broker:
        yield broker


@pytest.fixture
def daemon(broker: Mosquitto, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    config = tmp_path / "mcpd.toml"
    config.write_text(
        f"""
[mqtt]
enabled = true
host = "127.0.0.1"
port = {broker.port}
device_id = "sim1"
telemetry_ms = 250
commands_enabled = true
"""
    )
    command = [
        sys.executable,
        "-m",
        "mcpd",
        "run",
        "--simulate",
        "jetson-orin-nano",
        "--sim-root",
        str(tmp_path / "board"),
        "--config",
        str(config),
    ]
    with open(tmp_path / "daemon.log", "wb") as log:
        process = subprocess.Popen(command, cwd=PROJECT, stderr=log)
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def retained_status(broker: Mosquitto) -> bytes:
    with recording(broker, STATUS) as recorder:
        [message] = recorder.wait_for(STATUS)
    assert message.retain
    return message.payload


def test_the_daemon_says_online_answers_commands_and_says_offline_when_stopped(
    broker: Mosquitto, daemon: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    with recording(broker, TELEMETRY, "mcpd/sim1/cmd/+/reply") as recorder:
        first = recorder.wait_for(TELEMETRY, timeout=30)[0].json()
        assert first["platform"] == "jetson-orin" and first["domains"]
        assert retained_status(broker) == b"online"
        recorder.client.publish("mcpd/sim1/cmd/pause", b'{"id": 1}', qos=1)
        [reply] = recorder.wait_for("mcpd/sim1/cmd/pause/reply")
        assert reply.json() == {"command": "pause", "id": 1, "ok": True, "result": {"paused": True}}
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=20) == 0, (tmp_path / "daemon.log").read_text()
    assert retained_status(broker) == b"offline"


def test_the_last_will_says_offline_when_the_daemon_is_killed(
    broker: Mosquitto, daemon: subprocess.Popen[bytes]
) -> None:
    with recording(broker, TELEMETRY) as recorder:
        recorder.wait_for(TELEMETRY, timeout=30)
    assert retained_status(broker) == b"online"
    daemon.send_signal(signal.SIGKILL)
    daemon.wait(timeout=10)
    with recording(broker, STATUS) as recorder:
        recorder.wait(lambda ms: any(m.payload == b"offline" for m in ms))
