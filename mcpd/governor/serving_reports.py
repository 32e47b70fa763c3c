"""What the serving process tells the governor over the socket pair (mcpd.ipc): that it is ready,
the acknowledgement of each configuration, its events (forwarded to the governor's bus: the log,
MQTT) and its models' statistics (kept for the status document)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from mcpd.events import Event, EventBus
from mcpd.governor.config_delivery import ConfigDelivery
from mcpd.snapshot import ModelStats


class ServingReports:
    def __init__(self, events: EventBus, delivery: ConfigDelivery) -> None:
        self.events = events
        self.delivery = delivery
        self.stats: dict[str, ModelStats] = {}
        """The models' statistics as serving last sent them."""

    def take(self, messages: Iterable[Mapping[str, Any]]) -> bool:
        """Act on each message; True when serving said it is ready."""
        ready = False
        for message in messages:
            kind = message.get("kind")
            if kind == "ready":
                ready = True
            elif kind == "configured":
                self.delivery.acknowledged(message.get("generation"), message.get("error"))
            elif kind == "event":
                self._forward(message.get("event"))
            elif kind == "stats":
                self.stats = _model_stats(message.get("models"))
        return ready

    def lost(self) -> None:
        """The serving process exited: its models are not ready, their counts stay."""
        self.stats = {name: dataclasses.replace(s, ready=False) for name, s in self.stats.items()}

    def _forward(self, event: object) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("message"), str):
            return
        data = event.get("data")
        self.events.publish(
            Event(
                str(event.get("kind", "model")),
                event["message"],
                data if isinstance(data, dict) else {},
            )
        )


def _model_stats(models: object) -> dict[str, ModelStats]:
    """Statistics as the child sent them; anything malformed is left out."""
    stats: dict[str, ModelStats] = {}
    if not isinstance(models, dict):
        return stats
    for name, fields in models.items():
        if not isinstance(fields, dict):
            continue
        try:
            stats[str(name)] = ModelStats(**fields)
        except TypeError:
            continue
    return stats
