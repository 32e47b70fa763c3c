"""The board's retained status, `<p>/<id>/status`: whether it is there, and where it is connected.

`online` at each connect and again every `heartbeat_s`, with MQTT 5 message expiry 3 x heartbeat_s;
`offline` from the Will when the connection is lost, or said by the board at a clean stop (no
expiry: it stays). The repetition is for the case the Will does not cover: a broker node that dies
takes its boards' sessions and their Wills with it (seen on ejabberd 23.01; reported for EMQX in
emqx/emqx#1667), so a board lost together with its node would read `online` forever; its status now
expires by itself, and the broker no longer hands it to a new subscriber. MQTT 3.1.1 has no expiry:
readers judge by the last time they heard from a board (README, "Brokers and liveness").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from paho.mqtt.reasoncodes import ReasonCode

from mcpd.config import MqttSection
from mcpd.status import MqttDoc
from mcpd.telemetry.mqtt_client import publish_properties
from mcpd.telemetry.topics import Topics

EXPIRY_HEARTBEATS = 3
"""A retained `online` outlives its heartbeat by two missed ones: a late heartbeat (a broker slow
to acknowledge, a busy board) is no death."""


class Send(Protocol):
    def __call__(
        self, topic: str, payload: bytes, retain: bool = False, properties: Any = None
    ) -> int | None: ...


def not_connected() -> MqttDoc:
    return {"broker": None, "since": None}


class Liveness:
    """Owned by the publisher's thread; `connection` is replaced whole, so other threads read it."""

    def __init__(self, topics: Topics, mqtt: MqttSection, wall: Callable[[], float]) -> None:
        self.topic = topics.status
        self._wall = wall
        self.connection = not_connected()
        self.next_at = 0.0
        """When `online` is due again (while connected)."""
        self.offline_acked = False
        self._offline_mid: int | None = None
        self.configure(mqtt, self.next_at)

    def configure(self, mqtt: MqttSection, now: float) -> None:
        """Settings from `[mqtt]`; a shorter heartbeat brings the next one forward (it carries the
        new expiry)."""
        self.heartbeat_s = mqtt.heartbeat_s
        self.next_at = min(self.next_at, now + mqtt.heartbeat_s)
        expiry = EXPIRY_HEARTBEATS * mqtt.heartbeat_s
        self._properties = publish_properties(expiry, None) if mqtt.protocol == "5" else None

    def connected(self, broker: str, send: Send, now: float) -> None:
        self.connection = {"broker": broker, "since": round(self._wall(), 3)}
        self.online(send, now)

    def lost(self) -> None:
        self.connection = not_connected()

    def online(self, send: Send, now: float) -> None:
        send(self.topic, b"online", retain=True, properties=self._properties)
        self.next_at = now + self.heartbeat_s

    def offline(self, send: Send) -> None:
        self._offline_mid = send(self.topic, b"offline", retain=True)

    def acked(self, mid: int, reason: ReasonCode) -> None:
        if mid == self._offline_mid:
            self.offline_acked = not reason.is_failure
