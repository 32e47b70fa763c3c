"""The real daemon on a simulated board, publishing to a real broker: status, Will, commands."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mcpd.ctl import main
from tests.support.daemon import DaemonProcess, simulated
from tests.support.mqtt_broker import Mosquitto, free_port, mosquitto_binary, recording

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")

STATUS = "mcpd/sim1/status"
TELEMETRY = "mcpd/sim1/telemetry"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with Mosquitto(tmp_path / "broker") as broker:
        yield broker


@pytest.fixture
def daemon(broker: Mosquitto, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    mqtt = f"""
host = "127.0.0.1"
port = {broker.port}
commands_enabled = true
"""
    with running(tmp_path, mqtt) as process:
        yield process


@contextmanager
def running(tmp_path: Path, mqtt: str) -> Iterator[subprocess.Popen[bytes]]:
    """The daemon on a simulated Jetson Orin Nano, as device sim1, with these [mqtt] keys."""
    config = tmp_path / "mcpd.toml"
    config.write_text(f'[mqtt]\nenabled = true\ndevice_id = "sim1"\ntelemetry_ms = 250\n{mqtt}')
    board = simulated("jetson-orin-nano", tmp_path / "board")
    with DaemonProcess(config, *board, log=tmp_path / "daemon.log") as daemon:
        yield daemon.process


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


def test_on_a_broker_list_the_daemon_says_where_it_is_and_beats_its_heart(
    broker: Mosquitto, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Of a list with a broker that is not there, the board ends on the one that is (in its own
    order), says so in its telemetry and in `mcpctl status`, and says `online` every heartbeat."""
    live = f"127.0.0.1:{broker.port}"
    mqtt = f'brokers = ["127.0.0.1:{free_port()}", "{live}"]\nheartbeat_s = 1\n'
    with running(tmp_path, mqtt), recording(broker, TELEMETRY, STATUS) as recorder:
        recorder.wait_for(STATUS, 2, timeout=30)
        told = recorder.wait_for(TELEMETRY, timeout=30)[-1].json()["mqtt"]
        assert told["broker"] == live and told["since"] <= time.time()
        socket = str(tmp_path / "board/run/mcpd/mcpd.sock")
        assert main(["--socket", socket, "status"]) == 0
        assert f"mqtt         {live} since " in capsys.readouterr().out
