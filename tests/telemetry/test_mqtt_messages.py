"""What goes on the wire: the telemetry schema, events, device ids, Home Assistant discovery."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from mcpd import config, status
from mcpd.events import Event
from mcpd.snapshot import ModelStats
from mcpd.status import StatusDocument
from mcpd.telemetry import encoder, homeassistant
from mcpd.telemetry.topics import Topics, device_id
from tests.support.mqtt_status import FakeBoard

TELEMETRY_KEYS = {
    "schema",
    "device_id",
    "seq",
    "ts",
    "platform",
    "model",
    "temperature_c",
    "power_w",
    "power_estimated",
    "temperatures",
    "powers",
    "domains",
    "governor",
    "batch",
    "inference",
    "daemon",
    "requests_per_s",
    "spool",
}


def telemetry(status: StatusDocument, seq: int = 7, rate: float | None = 12.5) -> Any:
    payload = encoder.telemetry(
        status, device="b1", seq=seq, requests_per_s=rate, queued=3, dropped=2
    )
    return json.loads(payload)


def document(ts: float = 1.0, **changes: Any) -> StatusDocument:
    """A status document as the daemon makes it, with `changes` to its top-level keys."""
    status = FakeBoard(clock=lambda: ts)()
    status.update(changes)  # type: ignore[typeddict-item]
    return status


def test_telemetry_is_the_status_document_plus_seq_rate_and_spool() -> None:
    status = FakeBoard()()
    message = telemetry(status)
    assert set(message) >= TELEMETRY_KEYS
    assert "placement" in status and "placement" not in message  # stays on the board
    assert {k: message[k] for k in status if k != "placement"} == {
        k: v for k, v in status.items() if k != "placement"
    }
    assert (message["schema"], message["device_id"], message["seq"]) == (1, "b1", 7)
    assert message["spool"] == {"queued": 3, "dropped": 2}
    assert isinstance(message["ts"], float)
    domain = message["domains"]["policy0"]
    assert {"cap_mhz", "cur_mhz"} <= set(domain)
    assert set(message["governor"]) == {
        "state",
        "policy",
        "profile",
        "external_cap_changes",
        "last_action",
    }
    assert set(message["inference"]["demo"]) >= {
        "requests",
        "errors",
        "p50_ms",
        "p99_ms",
        "queue_depth",
    }
    assert set(message["daemon"]) >= {"cpu_percent", "rss_mb", "uptime_s"}


def test_values_json_has_no_word_for_become_null() -> None:
    message = telemetry(document(temperature_c=float("nan"), powers={"rail": float("inf")}))
    assert message["temperature_c"] is None and message["powers"] == {"rail": None}


def test_request_rate_is_per_second_between_documents_and_unknown_after_a_reset() -> None:
    rate = encoder.RequestRate()

    def served(ts: float, **requests: int) -> StatusDocument:
        models = {name: ModelStats(True, count) for name, count in requests.items()}
        return document(ts, inference=status.inference(models))

    assert rate(served(10.0, a=100, b=50)) is None
    assert rate(served(12.0, a=130, b=60)) == 20.0
    assert rate(served(13.0, a=5)) is None  # daemon restarted
    assert rate(served(14.0, a=6)) == 1.0


def test_an_event_carries_kind_message_and_data() -> None:
    payload = encoder.event(Event("fault", "sensor lost", {"sensor": Path("/x")}, 5.0), device="b")
    assert json.loads(payload) == {
        "schema": 1,
        "device_id": "b",
        "ts": 5.0,
        "kind": "fault",
        "message": "sensor lost",
        "data": {"sensor": "/x"},
    }


def test_device_id_is_configured_else_a_hash_of_the_machine_id_else_the_hostname(
    tmp_path: Path,
) -> None:
    machine_id = tmp_path / "machine-id"
    assert device_id("edge-7", machine_id) == "edge-7"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")
    derived = device_id("", machine_id)
    assert re.fullmatch(r"[0-9a-f]{16}", derived)
    assert "0123456789abcdef" not in derived  # the machine id itself stays private
    assert device_id("", machine_id) == derived
    machine_id.write_text("uninitialized\n")
    assert device_id("", machine_id, lambda: "jetson.lab.example") == "jetson"
    assert device_id("", tmp_path / "missing", lambda: "rock 5b+") == "rock-5b"


def test_topics() -> None:
    topics = Topics("fleet/site1", "b1")
    assert topics.status == "fleet/site1/b1/status"
    assert topics.commands == "fleet/site1/b1/cmd/+"
    assert topics.command_name("fleet/site1/b1/cmd/pause") == "pause"
    assert topics.command_name("fleet/site1/b1/cmd/pause/reply") is None
    assert topics.command_name("fleet/site1/b2/cmd/pause") is None


def render(template: str, value_json: Any) -> Any:
    """Home Assistant's templates as discovery uses them: `{{ value_json.a.b['c'] }}` only."""
    match = re.fullmatch(r"\{\{ value_json((?:\.\w+|\['[^']+'\])+) \}\}", template)
    assert match, template
    for dotted, quoted in re.findall(r"\.(\w+)|\['([^']+)'\]", match.group(1)):
        value_json = value_json[dotted or quoted]
    return value_json


def test_discovery_configs_read_real_telemetry_and_follow_home_assistant_rules() -> None:
    status = FakeBoard(base_c=70.0)()
    topics = Topics("mcpd", "b1")
    configs = homeassistant.configs(status, topics, "homeassistant", 1.0)
    message = telemetry(status)
    values = {}
    for topic, payload in configs.items():
        config = json.loads(payload)
        unique_id = config["unique_id"]
        assert topic == f"homeassistant/sensor/{unique_id}/config"
        assert re.fullmatch(r"[a-zA-Z0-9_-]+", unique_id)
        assert config["state_topic"] == "mcpd/b1/telemetry"
        assert config["availability_topic"] == "mcpd/b1/status"
        assert (config["payload_available"], config["payload_not_available"]) == (
            "online",
            "offline",
        )
        assert config["device"]["identifiers"] == ["mcpd_b1"]
        values[unique_id] = (render(config["value_template"], message), config)
    temperature, config = values["mcpd_b1_temperature"]
    assert temperature == message["temperature_c"] and config["device_class"] == "temperature"
    assert config["unit_of_measurement"] == "°C"
    assert values["mcpd_b1_power"][0] == 7.5
    assert values["mcpd_b1_request_rate"][0] == 12.5
    assert values["mcpd_b1_governor"][0] in {"lowering", "holding"}
    cap, config = values["mcpd_b1_cap_17000000_gpu"]
    assert cap == message["domains"]["17000000.gpu"]["cap_mhz"]
    assert (config["device_class"], config["unit_of_measurement"]) == ("frequency", "MHz")
    assert "mcpd_b1_cap_policy0" in values


def test_a_board_without_a_power_meter_gets_no_power_sensor() -> None:
    unmetered = document(power_w=None, powers={}, domains={})
    configs = homeassistant.configs(unmetered, Topics("mcpd", "rk"), "homeassistant", 1.0)
    assert not any("power" in topic for topic in configs)


def test_an_estimated_power_is_named_so() -> None:
    estimated = document(power_w=9.5, powers={"estimate": 9.5}, domains={}, power_source="estimate")
    configs = homeassistant.configs(estimated, Topics("mcpd", "rk"), "homeassistant", 1.0)
    power = next(config for topic, config in configs.items() if "power" in topic)
    assert json.loads(power)["name"] == "Power (estimated)"


@pytest.mark.parametrize("period_s", [0.2, 1.0, 30.0])
def test_sensors_expire_after_three_missed_periods(period_s: float) -> None:
    configs = homeassistant.configs(FakeBoard()(), Topics("mcpd", "b"), "homeassistant", period_s)
    expiry = {json.loads(p)["expire_after"] for p in configs.values()}
    assert expiry == {max(10, round(3 * period_s))}


@pytest.mark.parametrize(
    ("mqtt", "problem"),
    [
        ({"device_id": "a/b"}, "mqtt.device_id: expected a string matching"),
        ({"topic_prefix": "mcpd/#"}, "mqtt.topic_prefix: expected a string matching"),
        ({"topic_prefix": "/mcpd"}, "mqtt.topic_prefix: expected a string matching"),
        ({"password_file": "/etc/mcpd/pass"}, "mqtt: password_file needs a username"),
        ({"tls": {"key_file": "/k.pem"}}, "mqtt: tls.key_file needs a tls.cert_file"),
        ({"message_expiry_s": -1}, "mqtt.message_expiry_s: expected greater than or equal to 0"),
    ],
)
def test_mqtt_config_mistakes_are_named(mqtt: dict[str, Any], problem: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.parse({"mqtt": mqtt})
    assert problem in str(info.value)
