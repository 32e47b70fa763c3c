"""Home Assistant MQTT discovery: the board's sensors appear in Home Assistant without YAML.

One retained config per sensor at `<ha prefix>/sensor/<unique id>/config` (retained, or Home
Assistant forgets them when it restarts), each reading the telemetry topic through a
`{{ value_json.… }}` template and bound to the status topic for availability (`online`/`offline`,
Home Assistant's defaults). An empty retained payload deletes a config: that is how a vanished
frequency domain, or turning discovery off, removes its sensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mcpd import __version__
from mcpd.status import StatusDocument
from mcpd.telemetry.encoder import dumps
from mcpd.telemetry.topics import Topics


@dataclass(frozen=True)
class Sensor:
    key: str
    name: str
    path: str
    """Where the value is in a telemetry message, as a template expression under value_json."""
    unit: str | None = None
    device_class: str | None = None
    state_class: str | None = "measurement"


def _sensors(status: StatusDocument) -> list[Sensor]:
    sensors = [Sensor("temperature", "Temperature", ".temperature_c", "°C", "temperature")]
    if status["power_w"] is not None or status["powers"]:
        sensors.append(Sensor("power", "Power", ".power_w", "W", "power"))
    sensors += [
        Sensor("request_rate", "Request rate", ".requests_per_s", "req/s"),
        Sensor("governor", "Governor", ".governor.state", state_class=None),
    ]
    for name in sorted(status["domains"]):
        if any(c in name for c in "'\\{}"):
            continue  # cannot be quoted safely in a template; sysfs names never have these
        key = "cap_" + "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
        sensors.append(
            Sensor(key, f"{name} cap", f".domains['{name}'].cap_mhz", "MHz", "frequency")
        )
    return sensors


def configs(
    status: StatusDocument, topics: Topics, ha_prefix: str, telemetry_s: float
) -> dict[str, bytes]:
    """Config topic → retained payload, for every sensor this board has."""
    device = {
        "identifiers": [f"mcpd_{topics.device}"],
        "name": f"mcpd {topics.device}",
        "model": status["model"] or status["platform"] or "unknown",
        "sw_version": __version__,
    }
    result = {}
    for sensor in _sensors(status):
        unique_id = f"mcpd_{topics.device}_{sensor.key}"
        config: dict[str, Any] = {
            "name": sensor.name,
            "unique_id": unique_id,
            "state_topic": topics.telemetry,
            "value_template": f"{{{{ value_json{sensor.path} }}}}",
            "availability_topic": topics.status,
            "payload_available": "online",
            "payload_not_available": "offline",
            # Unavailable when telemetry stops although the daemon still holds its connection.
            "expire_after": max(10, math.ceil(3 * telemetry_s)),
            "device": device,
            "origin": {"name": "mcpd", "sw_version": __version__},
        }
        optional = {
            "unit_of_measurement": sensor.unit,
            "device_class": sensor.device_class,
            "state_class": sensor.state_class,
        }
        config.update({key: value for key, value in optional.items() if value is not None})
        result[f"{ha_prefix}/sensor/{unique_id}/config"] = dumps(config)
    return result


class Published:
    """The configs Home Assistant has from us, so that only changes are sent again."""

    def __init__(self) -> None:
        self._sent: dict[str, bytes] = {}

    def update(self, wanted: dict[str, bytes], force: bool) -> list[tuple[str, bytes]]:
        """What to publish (retained) to get from what was sent to `wanted`."""
        changes = [(t, p) for t, p in wanted.items() if force or self._sent.get(t) != p]
        changes += [(topic, b"") for topic in self._sent.keys() - wanted.keys()]  # deletes
        self._sent = dict(wanted)
        return changes
