"""Publishing to a real mosquitto: telemetry, status, events, discovery, commands, TLS, credentials."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mcpd.events import Event, EventBus
from mcpd.telemetry.journal import Message
from mcpd.telemetry.publisher import MAX_EVENT_BYTES
from tests.support.mqtt_broker import (
    Mosquitto,
    TlsFiles,
    make_certificates,
    mosquitto_binary,
    publishing,
    recording,
    settings,
)
from tests.support.mqtt_status import FakeBoard
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")

T = "mcpd/b1/telemetry"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with Mosquitto(tmp_path / "broker") as broker:
        yield broker


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


def wait_online(broker: Mosquitto) -> None:
    """Until the publisher is connected: `online` and discovery precede any telemetry."""
    with recording(broker, T) as recorder:
        recorder.wait_for(T)


def test_telemetry_comes_every_period_in_seq_order_with_expiry(
    broker: Mosquitto, tmp_path: Path
) -> None:
    with (
        recording(broker, T) as recorder,
        publishing(settings(broker, message_expiry_s=120), tmp_path),
    ):
        messages = recorder.wait_for(T, 8)
    bodies = [m.json() for m in messages]
    assert [b["seq"] for b in bodies] == list(range(len(bodies)))
    gaps = [b["ts"] - a["ts"] for a, b in itertools.pairwise(bodies)]
    assert 0.15 <= statistics.median(gaps) <= 0.25  # telemetry_ms = 200
    assert bodies[-1]["device_id"] == "b1" and bodies[-1]["platform"] == "jetson-orin"
    assert bodies[-1]["requests_per_s"] is not None
    assert messages[0].properties.MessageExpiryInterval == 120
    assert messages[0].properties.ContentType == "application/json"


def test_the_publisher_tells_of_each_message_the_broker_acknowledged(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """Told once the PUBACK is in, so a message told of was heard; and every one heard, told."""
    told: list[Message] = []
    with recording(broker, T) as recorder:
        with publishing(settings(broker), tmp_path, delivered=told.append):
            recorder.wait_for(T, 5)
        heard = [m.json()["seq"] for m in recorder.on(T)]
    telemetry = [json.loads(m.payload)["seq"] for m in told if m.kind == "telemetry"]
    assert len(telemetry) >= 5 and telemetry == heard


def test_online_is_retained_and_a_clean_stop_publishes_offline(
    broker: Mosquitto, tmp_path: Path
) -> None:
    with publishing(settings(broker), tmp_path):
        wait_online(broker)
        with recording(broker, "mcpd/b1/status") as late:
            [status] = late.wait_for("mcpd/b1/status")
        assert (status.payload, status.retain) == (b"online", True)
    with recording(broker, "mcpd/b1/status") as later:
        [status] = later.wait_for("mcpd/b1/status")
    assert (status.payload, status.retain) == (b"offline", True)


def test_events_go_out_on_their_topic_with_qos_1(broker: Mosquitto, tmp_path: Path) -> None:
    bus = EventBus()
    with (
        recording(broker, "mcpd/b1/events") as recorder,
        publishing(settings(broker, qos=0), tmp_path) as publisher,
    ):
        bus.subscribe(publisher.submit)
        bus.publish(Event("governor", "lower: 86.0 °C", {"action": "lower"}))
        bus.publish(Event("model", "loaded demo", {"model": "demo"}))
        messages = recorder.wait_for("mcpd/b1/events", 2)
    assert [m.json()["kind"] for m in messages] == ["governor", "model"]
    assert messages[0].json()["data"] == {"action": "lower"}


def test_an_event_too_large_for_a_line_is_dropped_and_said_once(
    broker: Mosquitto, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The serving process may send any event: one of megabytes would take the spool's room of
    hundreds, in memory and on disk."""
    huge = "x" * MAX_EVENT_BYTES
    with (
        caplog.at_level(logging.WARNING, "mcpd.telemetry"),
        recording(broker, "mcpd/b1/events") as recorder,
        publishing(settings(broker), tmp_path) as publisher,
    ):
        for _ in range(3):
            publisher.submit(Event("model", huge))
        publisher.submit(Event("model", "model demo loaded"))
        messages = recorder.wait_for("mcpd/b1/events")
    assert [m.json()["message"] for m in messages] == ["model demo loaded"]
    [said] = [r.getMessage() for r in caplog.records if "event dropped" in r.getMessage()]
    assert "a 'model' event dropped (" in said and f"at most {MAX_EVENT_BYTES})" in said


def test_home_assistant_discovery_is_retained_refreshed_and_removable(
    broker: Mosquitto, tmp_path: Path
) -> None:
    mqtt = settings(broker, homeassistant_discovery=True)
    configs = "homeassistant/sensor/+/config"
    with publishing(mqtt, tmp_path) as publisher:
        wait_online(broker)
        with recording(broker, configs) as late:
            found = late.wait(lambda ms: len(ms) >= 6)
        assert all(m.retain for m in found)
        names = {json.loads(m.payload)["name"] for m in found}
        assert {"Temperature", "Power", "Request rate", "policy0 cap"} <= names
        with recording(broker, configs) as watcher:
            watcher.wait(lambda ms: len(ms) >= 6)  # the retained ones
            watcher.client.publish("homeassistant/status", b"online", qos=1)
            watcher.wait(lambda ms: len(ms) >= 12)  # Home Assistant restarted: sent again
            publisher.reconfigure(dataclasses.replace(mqtt, homeassistant_discovery=False))
            watcher.wait(lambda ms: sum(m.payload == b"" for m in ms) >= 6)
    with recording(broker, configs, "mcpd/b1/status") as after:
        after.wait_for("mcpd/b1/status")
        assert after.on("mcpd/b1/status")[0].payload == b"offline"
        assert [m for m in after.messages if m.topic != "mcpd/b1/status"] == []


class Commands:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(name)
        return {"ok": True, "paused": name == "pause"}


def test_commands_are_answered_on_the_reply_or_response_topic(
    broker: Mosquitto, tmp_path: Path
) -> None:
    daemon = Commands()
    mqtt = settings(broker, commands_enabled=True)
    with (
        recording(broker, "mcpd/b1/status", "mcpd/b1/cmd/+/reply", "app/replies") as r,
        publishing(mqtt, tmp_path, run_command=daemon),
    ):
        r.wait_for("mcpd/b1/status")
        r.client.publish("mcpd/b1/cmd/pause", b'{"id": "a"}', qos=1)
        [reply] = r.wait_for("mcpd/b1/cmd/pause/reply")
        assert reply.json() == {
            "command": "pause",
            "id": "a",
            "ok": True,
            "result": {"paused": True},
        }
        request = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        request.ResponseTopic = "app/replies"
        request.CorrelationData = b"\x01\x02"
        r.client.publish("mcpd/b1/cmd/resume", b"", qos=1, properties=request)
        [reply] = r.wait_for("app/replies")
        assert reply.json()["ok"] and reply.properties.CorrelationData == b"\x01\x02"
        r.client.publish("mcpd/b1/cmd/shell", b'{"args": {"cmd": "reboot"}}', qos=1)
        [reply] = r.wait_for("mcpd/b1/cmd/shell/reply")
        assert (
            reply.json()["ok"] is False
            and "allowed: pause, profile, resume" in reply.payload.decode()
        )
    assert daemon.calls == ["pause", "resume"]


def test_commands_are_not_even_subscribed_unless_enabled(broker: Mosquitto, tmp_path: Path) -> None:
    daemon = Commands()
    mqtt = settings(broker, homeassistant_discovery=True)
    configs = "homeassistant/sensor/+/config"
    with (
        recording(broker, configs, "mcpd/b1/cmd/+/reply") as r,
        publishing(mqtt, tmp_path, run_command=daemon),
    ):
        r.wait(lambda ms: len(ms) >= 6)
        r.client.publish("mcpd/b1/cmd/pause", b"", qos=1)
        # Sent after the command by the same client: once the publisher has acted on this, it
        # would have had the command first, had it subscribed.
        r.client.publish("homeassistant/status", b"online", qos=1)
        r.wait(lambda ms: len(ms) >= 12)
        assert r.on("mcpd/b1/cmd/pause/reply") == []
    assert daemon.calls == []


def test_tls_with_a_client_certificate_and_a_password_file(
    tmp_path: Path, certificates: TlsFiles
) -> None:
    password = tmp_path / "mqtt.pass"
    password.write_text("s3cret\n")
    tls = {
        "enabled": True,
        "ca_file": str(certificates.ca),
        "cert_file": str(certificates.client_cert),
        "key_file": str(certificates.client_key),
    }
    users = {"board": "s3cret", "ops": "ops-pass"}
    with Mosquitto(tmp_path / "broker", tls=certificates, users=users) as broker:
        mqtt = settings(
            broker, host="localhost", tls=tls, username="board", password_file=str(password)
        )
        with (
            recording(broker, T, username="ops", password="ops-pass") as recorder,
            publishing(mqtt, tmp_path),
        ):
            assert recorder.wait_for(T, 2)[-1].json()["seq"] == 1


def test_an_untrusted_broker_certificate_is_named_in_the_log(
    tmp_path: Path, certificates: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    other = make_certificates(tmp_path / "other")  # a CA that did not sign the broker's cert
    tls = {"enabled": True, "ca_file": str(other.ca)}
    with (
        Mosquitto(tmp_path / "broker", tls=certificates) as broker,
        caplog.at_level(logging.WARNING, "mcpd.telemetry"),
        publishing(settings(broker, tls=tls), tmp_path),
    ):
        wait_until(
            lambda: "broker certificate not trusted" in caplog.text, 10, "the refusal logged"
        )
    assert "check [mqtt.tls] ca_file" in caplog.text


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_rejected_credentials_are_logged_clearly_and_retried_until_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    password = tmp_path / "mqtt.pass"
    password.write_text("wrong\n")
    with Mosquitto(tmp_path / "broker", users={"board": "right"}) as broker:
        mqtt = settings(broker, protocol=protocol, username="board", password_file=str(password))
        with (
            caplog.at_level(logging.DEBUG, "mcpd.telemetry"),
            recording(broker, T, username="board", password="right") as recorder,
            publishing(mqtt, tmp_path) as publisher,
        ):

            def refusals() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "refused the connection" in r.getMessage()]

            wait_until(lambda: len(refusals()) >= 2, 10, "two refusals")
            first = refusals()[0]
            assert first.levelno == logging.WARNING
            assert "check [mqtt] username and password_file" in first.getMessage()
            assert "retrying in" in first.getMessage()
            password.write_text("right\n")  # read again at every attempt
            recorder.wait_for(T)
            assert publisher._thread.is_alive()


def test_a_failing_status_source_skips_samples_and_recovers(
    broker: Mosquitto, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    board = FakeBoard()
    board.fail = True
    with (
        caplog.at_level(logging.WARNING, "mcpd.telemetry"),
        recording(broker, T) as recorder,
        publishing(settings(broker), tmp_path, status=board),
    ):
        wait_until(lambda: "no usable status document" in caplog.text, 10, "the warning logged")
        board.fail = False
        assert recorder.wait_for(T)[0].json()["seq"] == 0
