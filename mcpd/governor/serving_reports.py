"""What the serving process tells the governor over the socket pair (mcpd.ipc): that it is ready,
the acknowledgement of each configuration, its events (forwarded to the governor's bus: the log,
MQTT) and its models' statistics (kept for the status document)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from mcpd import ipc
from mcpd.events import Event, EventBus
from mcpd.governor.config_delivery import ConfigDelivery
from mcpd.snapshot import ModelStats


class ServingReports:
    def __init__(self, events: EventBus, delivery: ConfigDelivery) -> None:
        self.events = events
        self.delivery = delivery
        self.stats: dict[str, ModelStats] = {}
        """The models' statistics as serving last sent them."""

    def take(self, messages: Iterable[ipc.Message]) -> bool:
        """Act on each message; True when serving said it is ready."""
        ready = False
        for message in messages:
            if message["kind"] == "ready":
                ready = True
            elif message["kind"] == "configured":
                self.delivery.acknowledged(message["generation"], message["error"])
            elif message["kind"] == "event":
                event = message["event"]
                self.events.publish(Event(event["kind"], event["message"], event["data"]))
            elif message["kind"] == "stats":
                self.stats = ipc.model_stats(message)
        return ready

    def lost(self) -> None:
        """The serving process exited: its models are not ready, their counts stay."""
        self.stats = {name: dataclasses.replace(s, ready=False) for name, s in self.stats.items()}
