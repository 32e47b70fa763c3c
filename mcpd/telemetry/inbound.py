"""What the board listens to on the broker (commands, Home Assistant's status), guarded against
floods.

Every message on a subscribed topic costs the publisher's thread a read and a parse in paho, and
sits in the same TCP stream as the acknowledgements of the telemetry: a flood the thread cannot
keep up with piles up at the broker in front of them, and telemetry stops leaving (issue 26: 0 of
35 messages in 8 s of malformed commands). So a subscription that receives more than FLOOD_PER_S
messages a second is left (UNSUBSCRIBE) for QUIET_S: the broker, which is built for it, drops what
follows, and the board reads only what was already on its way. It is taken up again after that,
and left again at once if the flood goes on.
"""

from __future__ import annotations

import logging
import math

import paho.mqtt.client as paho

from sensors.episodes import Repeats

log = logging.getLogger("mcpd.telemetry")

FLOOD_PER_S = 20.0
"""Messages a second on one subscription that make a flood (no person or fleet tool sends that)."""
FLOOD_BURST = 50
QUIET_S = 10.0
"""How long a flooded subscription is left."""
SAY_EVERY_S = 60.0
REDISCOVERY_PER_S = 0.1
"""Home Assistant's `online` makes every config go again at most this often (they are retained at
the broker: one missed costs nothing there)."""


class TokenBucket:
    """Admits `rate_per_s` on average and `burst` at once; the caller passes `now`."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._at: float | None = None

    def take(self, now: float) -> bool:
        if self._at is not None:
            refill = max(0.0, now - self._at) * self.rate_per_s
            self._tokens = min(float(self.burst), self._tokens + refill)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class Subscription:
    """One topic filter: whether the board should be subscribed to it now, and whether a message
    that arrived on it is to be looked at. Pure: the caller passes `now` and does the MQTT."""

    def __init__(self, topic: str, qos: int = 1) -> None:
        self.topic = topic
        self.qos = qos
        self.active = False
        """Subscribed on the current connection (kept by the caller)."""
        self._arrivals = TokenBucket(FLOOD_PER_S, FLOOD_BURST)
        self._quiet_until = -math.inf
        self._floods: Repeats[str] = Repeats(SAY_EVERY_S)

    def wanted(self, now: float) -> bool:
        return now >= self._quiet_until

    def reopens_at(self, now: float) -> float:
        """When a subscription left for a flood is to be taken up again (inf: it is not left)."""
        return self._quiet_until if now < self._quiet_until else math.inf

    def admit(self, now: float) -> bool:
        """A message arrived: False when it is to be dropped unread (a flood, or what was still on
        its way when the subscription was left)."""
        if now < self._quiet_until:
            return False
        if self._arrivals.take(now):
            return True
        self._quiet_until = now + QUIET_S
        unsaid = self._floods.say("flood", now)
        if unsaid is not None:
            again = f"; {unsaid} more floods since it was last said" if unsaid else ""
            log.warning(
                "MQTT topic %s: more than %g messages/s, a flood; not listening to it for %g s%s",
                self.topic,
                FLOOD_PER_S,
                QUIET_S,
                again,
            )
        return False


class Inbound:
    """The board's two subscriptions, for the publisher's thread: the command topic, and Home
    Assistant's status (its `online` after a restart asks for every discovery config again)."""

    def __init__(self, commands: str, assistant_status: str) -> None:
        self.commands = Subscription(commands)
        self.assistant_status = Subscription(assistant_status)
        self._rediscovery = TokenBucket(REDISCOVERY_PER_S, 3)

    def connected(self) -> None:
        """A new connection: subscribed to nothing yet."""
        self.commands.active = self.assistant_status.active = False

    def follow(self, client: paho.Client, now: float, commands: bool, discovery: bool) -> None:
        """Subscribe to what is wanted now and leave what is not (a flood, discovery turned off)."""
        for subscription, enabled in (
            (self.commands, commands),
            (self.assistant_status, discovery),
        ):
            wanted = enabled and subscription.wanted(now)
            if wanted and not subscription.active:
                client.subscribe(subscription.topic, subscription.qos)
            elif subscription.active and not wanted:
                client.unsubscribe(subscription.topic)
            subscription.active = wanted

    def due(self, now: float) -> float:
        """When `follow` has something to do next."""
        return min(self.commands.reopens_at(now), self.assistant_status.reopens_at(now))

    def rediscover(self, payload: bytes, now: float) -> bool:
        """Whether this message on Home Assistant's status asks for the configs now."""
        online = self.assistant_status.admit(now) and payload == b"online"
        return online and self._rediscovery.take(now)
