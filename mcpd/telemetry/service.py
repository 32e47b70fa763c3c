"""The daemon's telemetry service: MQTT publishing of status, events and (optionally) commands.

A thin asyncio face over the Publisher thread: `start` never waits for the broker, `stop` waits
for the publisher's bounded goodbye off the event loop, `reload` applies what it can to the running
publisher and starts a new one for anything that needs a new connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from mcpd.config import Config, MqttSection
from mcpd.events import Event, EventBus
from mcpd.status import MqttDoc, StatusDocument
from mcpd.telemetry import commands
from mcpd.telemetry.publisher import Publisher
from mcpd.telemetry.topics import MACHINE_ID, device_id

log = logging.getLogger("mcpd.telemetry")

SPOOL_FILE = "telemetry.spool"
LIVE = frozenset(
    {
        "telemetry_ms",
        "qos",
        "spool_messages",
        "message_expiry_s",
        "reconnect_max_s",
        "homeassistant_discovery",
        "heartbeat_s",
    }
)
"""[mqtt] keys a reload applies to the running connection; any other change reconnects."""


class TelemetryService:
    name = "telemetry"

    def __init__(
        self,
        config: Config,
        status: Callable[[], StatusDocument],
        events: EventBus,
        commands: commands.Runner | None = None,
        machine_id: Path = MACHINE_ID,
    ) -> None:
        self.config = config
        self._status = status
        self._commands = commands
        self._machine_id = machine_id
        self._publisher: Publisher | None = None
        events.subscribe(self._on_event)

    @property
    def publisher(self) -> Publisher | None:
        return self._publisher

    def info(self) -> MqttDoc | None:
        """The status document's `mqtt`: which broker the board is on and since when."""
        publisher = self._publisher
        if publisher is None:
            return None if not self.config.mqtt.enabled else {"broker": None, "since": None}
        return publisher.connection

    def _on_event(self, event: Event) -> None:
        publisher = self._publisher
        if publisher is not None:
            publisher.submit(event)

    async def start(self) -> None:
        mqtt = self.config.mqtt
        if not mqtt.enabled:
            return
        device = device_id(mqtt.device_id, self._machine_id)
        publisher = Publisher(
            mqtt,
            device,
            Path(self.config.daemon.state_dir) / SPOOL_FILE,
            self._status,
            self._commands,
        )
        publisher.start()
        self._publisher = publisher
        log.info(
            "MQTT telemetry to %s every %d ms on %s/…",
            ", ".join(map(str, mqtt.addresses())),
            mqtt.telemetry_ms,
            publisher.topics.base,
        )

    async def stop(self) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            await asyncio.to_thread(publisher.stop)

    async def reload(self, config: Config) -> None:
        old, self.config = self.config, config
        changed = _changed(old.mqtt, config.mqtt)
        moved = old.daemon.state_dir != config.daemon.state_dir
        if not changed and not moved:
            return
        if self._publisher is not None and changed <= LIVE and not moved:
            self._publisher.reconfigure(config.mqtt)
            return
        log.info("telemetry: [mqtt] %s changed; reconnecting", ", ".join(sorted(changed)))
        await self.stop()
        await self.start()


def _changed(old: MqttSection, new: MqttSection) -> set[str]:
    keys = (f.name for f in dataclasses.fields(MqttSection))
    return {key for key in keys if getattr(old, key) != getattr(new, key)}
