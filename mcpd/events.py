"""Events (governor actions, faults, model loads) fanned out to whoever listens.

Subscribers are called on the publisher's thread and must not block (put the event on a queue
and return): the control loop publishes, and it must never wait on a broker or a socket.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("mcpd.events")

KINDS = ("governor", "fault", "model", "daemon", "competitor", "cooling")
"""The kinds of event mcpd makes. Append only: the telemetry spool's files number them."""


@dataclass(frozen=True)
class Event:
    kind: str
    """One of KINDS (an event forwarded from the serving process may say anything)."""
    message: str
    """One line for people."""
    data: Mapping[str, Any] = field(default_factory=dict)
    """JSON-able details for programs."""
    ts: float = field(default_factory=time.time)


Subscriber = Callable[[Event], None]


class EventBus:
    def __init__(self) -> None:
        self._subscribers: tuple[Subscriber, ...] = ()
        self._lock = threading.Lock()

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        with self._lock:
            self._subscribers = (*self._subscribers, subscriber)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

        return unsubscribe

    def publish(self, event: Event) -> None:
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception:  # a broken listener must not take the publisher down
                log.exception("event subscriber %r failed", subscriber)
