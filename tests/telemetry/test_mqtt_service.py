"""TelemetryService as the daemon drives it: start, events from the bus, reload, stop."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import statistics
from pathlib import Path

import pytest

from mcpd.config import Config, DaemonSection, MqttSection
from mcpd.events import Event, EventBus
from mcpd.telemetry import TelemetryService
from tests.support.mqtt_broker import Mosquitto, Recorder, mosquitto_binary, recording, settings
from tests.support.mqtt_status import FakeBoard

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")


def config(tmp_path: Path, mqtt: MqttSection) -> Config:
    return Config(daemon=DaemonSection(state_dir=str(tmp_path / "state")), mqtt=mqtt)


def periods(recorder: Recorder, topic: str, last: int) -> float:
    stamps = [m.json()["ts"] for m in recorder.on(topic)][-last:]
    return statistics.median(b - a for a, b in itertools.pairwise(stamps))


def test_events_reload_and_stop(tmp_path: Path) -> None:
    bus = EventBus()
    with Mosquitto(tmp_path / "broker") as broker, recording(broker, "mcpd/#") as recorder:
        first = config(tmp_path, settings(broker, device_id="one"))
        service = TelemetryService(first, FakeBoard(), bus)

        async def scenario() -> None:
            await service.start()
            await asyncio.to_thread(recorder.wait_for, "mcpd/one/telemetry", 3)
            bus.publish(Event("model", "loaded demo", {"model": "demo"}))
            await asyncio.to_thread(recorder.wait_for, "mcpd/one/events")
            # A live change: same connection, new period.
            slower = dataclasses.replace(
                first, mqtt=dataclasses.replace(first.mqtt, telemetry_ms=500)
            )
            await service.reload(slower)
            count = len(recorder.on("mcpd/one/telemetry"))
            await asyncio.to_thread(recorder.wait_for, "mcpd/one/telemetry", count + 6)
            assert 0.4 <= periods(recorder, "mcpd/one/telemetry", 5) <= 0.6
            assert [m.payload for m in recorder.on("mcpd/one/status")] == [b"online"]
            # A new identity needs a new connection: the old one says goodbye.
            moved = dataclasses.replace(
                slower, mqtt=dataclasses.replace(slower.mqtt, device_id="two")
            )
            await service.reload(moved)
            await asyncio.to_thread(recorder.wait_for, "mcpd/two/telemetry")
            await service.stop()

        asyncio.run(scenario())
        recorder.wait_for("mcpd/two/status", 2)
    assert [m.payload for m in recorder.on("mcpd/one/status")] == [b"online", b"offline"]
    assert [m.payload for m in recorder.on("mcpd/two/status")] == [b"online", b"offline"]
    # The second identity continues the same spool, so its seq carries on too.
    one = [m.json()["seq"] for m in recorder.on("mcpd/one/telemetry")]
    two = [m.json()["seq"] for m in recorder.on("mcpd/two/telemetry")]
    assert one + two == list(range(one[0], one[0] + len(one) + len(two)))


def test_disabled_telemetry_starts_nothing_and_ignores_events(tmp_path: Path) -> None:
    bus = EventBus()
    service = TelemetryService(config(tmp_path, MqttSection()), FakeBoard(), bus)
    asyncio.run(service.start())
    assert service.publisher is None
    bus.publish(Event("daemon", "started"))
    asyncio.run(service.stop())
    assert not (tmp_path / "state").exists()
