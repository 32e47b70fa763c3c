"""What the board listens to on the broker (commands, Home Assistant's status), and what that may
cost: whatever arrives there, governing and telemetry keep their time.

Issue 26: 80 000 malformed commands in 8 s took the governor from 30 MB to 600 MB, made its control
loop 678 ms late and stopped its telemetry. Each request was parsed, logged and answered; the
answers queued in paho without bound, and paho reads as many packets per call as it holds queued,
so reads grew longer and telemetry waited behind them. And a flood read more slowly than it comes
piles up at the broker in front of the telemetry's acknowledgements (one TCP stream carries both):
the in-flight window fills and telemetry stops leaving.

So a subscription that receives more than FLOOD_PER_S messages a second is left (UNSUBSCRIBE) for
QUIET_S: the broker, which is built for it, drops what follows, and the board reads only what was
already on its way. It is taken up again after that, and left again at once if the flood goes on.
Commands over RATE_PER_S are dropped before they are parsed, unanswered; at most ANSWERS_IN_FLIGHT
answers wait for the broker, so that they never take the room telemetry needs; each kind of
trouble is logged once per SAY_EVERY_S with how many went unsaid.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import paho.mqtt.client as paho

from mcpd.config import MqttSection
from mcpd.telemetry import commands
from mcpd.telemetry.topics import Topics
from sensors.episodes import Repeats

log = logging.getLogger("mcpd.telemetry")

FLOOD_PER_S = 20.0
"""Messages a second on one subscription that make a flood (no person or fleet tool sends that)."""
FLOOD_BURST = 50
QUIET_S = 10.0
"""How long a flooded subscription is left."""
SAY_EVERY_S = 60.0
RATE_PER_S = 1.0
"""Commands taken per second on average: people and fleet tools send a few a minute."""
BURST = 10
"""Commands taken at once after a quiet spell."""
ANSWERS_IN_FLIGHT = 10
"""Answers handed to the broker and not yet acknowledged, at most; a command that finds no room
for its answer is dropped before it runs."""
REDISCOVERY_PER_S = 0.1
"""Home Assistant's `online` makes every config go again at most this often (they are retained at
the broker: one missed costs nothing there)."""


@dataclass(frozen=True)
class Rediscover:
    """Home Assistant restarted: every discovery config is to be sent again."""


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

    def __init__(self, topic: str) -> None:
        self.topic = topic
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


class CommandTopic:
    """The requests on `<p>/<id>/cmd/<name>`, from admission to answer. Owned by the publisher's
    thread, which tells it what became of each answer it sent (`sent`, `acked`, `lost`)."""

    def __init__(self, run: commands.Runner, topics: Topics, v5: bool) -> None:
        self._run = run
        self._topics = topics
        self._v5 = v5
        self._admission = TokenBucket(RATE_PER_S, BURST)
        self._unsaid: Repeats[str] = Repeats(SAY_EVERY_S)
        self._answering: set[int] = set()
        """paho message ids of the answers not yet acknowledged."""

    def request(self, message: paho.MQTTMessage, name: str, now: float) -> commands.Reply | None:
        """Run the request and return its answer, or None when it is dropped unanswered."""
        if not self._admission.take(now):
            self._say("rate", now, f"a request over {RATE_PER_S:g}/s (burst {BURST}) dropped")
            return None
        if len(self._answering) >= ANSWERS_IN_FLIGHT:
            self._say("room", now, "a request dropped: the broker has not taken earlier answers")
            return None
        payload, retained = bytes(message.payload), bool(message.retain)
        reply, refused = commands.answer(name, payload, self._run, retained)
        if refused is not None:
            self._say("rejected", now, f"command {name!r} rejected: {refused}")
        return commands.addressed(message, reply, self._topics.reply(name), self._v5)

    def sent(self, mid: int | None) -> None:
        if mid is not None:
            self._answering.add(mid)

    def acked(self, mid: int) -> None:
        self._answering.discard(mid)

    def lost(self) -> None:
        """The connection went, and with it every answer still in paho's queue."""
        self._answering.clear()

    def _say(self, key: str, now: float, message: str) -> None:
        unsaid = self._unsaid.say(key, now)
        if unsaid is not None:
            more = f" ({unsaid} more since the last such line)" if unsaid else ""
            log.warning("command topic: %s%s", message, more)


class Inbound:
    """What the board hears, for the publisher's thread: the command topic (when there is a
    daemon to run commands), and Home Assistant's status (its `online` after a restart asks for
    every discovery config again)."""

    def __init__(
        self, topics: Topics, homeassistant_prefix: str, run: commands.Runner | None, v5: bool
    ) -> None:
        self.commands = Subscription(topics.commands)
        self.assistant_status = Subscription(f"{homeassistant_prefix}/status")
        self._requests = None if run is None else CommandTopic(run, topics, v5)
        self._topics = topics
        self._rediscovery = TokenBucket(REDISCOVERY_PER_S, 3)

    def connected(self) -> None:
        """A new connection: subscribed to nothing yet, no answer waiting."""
        self.commands.active = self.assistant_status.active = False
        self.lost()

    def lost(self) -> None:
        if self._requests is not None:
            self._requests.lost()

    def follow(self, client: paho.Client, now: float, mqtt: MqttSection) -> None:
        """Subscribe to what is wanted now and leave what is not (a flood, discovery turned off)."""
        for subscription, enabled in (
            (self.commands, mqtt.commands_enabled and self._requests is not None),
            (self.assistant_status, mqtt.homeassistant_discovery),
        ):
            wanted = enabled and subscription.wanted(now)
            if wanted and not subscription.active:
                client.subscribe(subscription.topic, qos=1)
            elif subscription.active and not wanted:
                client.unsubscribe(subscription.topic)
            subscription.active = wanted

    def due(self, now: float) -> float:
        """When `follow` has something to do next."""
        return min(self.commands.reopens_at(now), self.assistant_status.reopens_at(now))

    def heard(self, message: paho.MQTTMessage, now: float) -> commands.Reply | Rediscover | None:
        """What to do about a message: an answer to send, the discovery configs to send again, or
        nothing."""
        if message.topic == self.assistant_status.topic:
            online = self.assistant_status.admit(now) and message.payload == b"online"
            return Rediscover() if online and self._rediscovery.take(now) else None
        name = self._topics.command_name(message.topic)
        if name is None or self._requests is None or not self.commands.admit(now):
            return None
        return self._requests.request(message, name, now)

    def sent(self, mid: int | None) -> None:
        """An answer `heard` returned went to paho as `mid` (None: paho did not take it)."""
        if self._requests is not None and mid is not None:
            self._requests.sent(mid)

    def acked(self, mid: int) -> None:
        if self._requests is not None:
            self._requests.acked(mid)
