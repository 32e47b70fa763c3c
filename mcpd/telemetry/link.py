"""The link to the broker: connect, wait for CONNACK, keep alive, notice loss, retry with backoff.

Stepped by the publisher's thread, which is the only thread that touches the paho client once it
is connected; paho's callbacks run inside that thread's `loop_read`/`loop_write` calls. Only the
blocking part of connecting (TCP, TLS handshake: up to CONNECT_TIMEOUT_S) runs in a short-lived
thread, so that sampling and spooling go on meanwhile. Retries back off (mcpd.backoff) from 1 s,
doubling up to `reconnect_max_s`, each delay drawn from its upper half so that a fleet that lost its
broker at the same moment does not come back at the same moment. Each attempt, the first and every
one after a failure or a loss, goes to the next broker of the board's own order (mcpd.brokers), and
the delay doubles after each round of them, not each attempt: a cluster node that refuses a board
while the cluster recovers from losing another (ejabberd's 0x83) says nothing of the next node.
"""

from __future__ import annotations

import logging
import queue
import random
import select
import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal

import paho.mqtt.client as paho
from paho.mqtt.reasoncodes import ReasonCode

from mcpd.backoff import Backoff
from mcpd.brokers import Broker, order
from mcpd.config import MqttSection
from mcpd.telemetry import mqtt_client
from mcpd.telemetry.topics import Topics
from sensors.episodes import Repeats

log = logging.getLogger("mcpd.telemetry")

State = Literal["idle", "connecting", "handshake", "connected"]
RECONNECT_FIRST_S = 1.0
WARN_EVERY_S = 60.0
"""A repeated failure is logged at warning level at most this often (debug in between)."""


@dataclass(frozen=True)
class Connected:
    pass


@dataclass(frozen=True)
class Lost:
    pass


@dataclass(frozen=True)
class Acked:
    mid: int
    reason: ReasonCode


@dataclass(frozen=True)
class Received:
    message: paho.MQTTMessage


Fact = Connected | Lost | Acked | Received


class Link:
    def __init__(
        self,
        mqtt: MqttSection,
        topics: Topics,
        wake: Callable[[], None],
        now: float,
        *,
        jitter: random.Random | None = None,
    ) -> None:
        self.mqtt = mqtt
        self.topics = topics
        self.client: paho.Client | None = None
        self.state: State = "idle"
        self.facts: list[Fact] = []
        """What happened on the connection, for the publisher, in order."""
        self._wake = wake
        self._results: queue.SimpleQueue[tuple[int, paho.Client | None, str]] = queue.SimpleQueue()
        self._generation = 0
        self._connector: threading.Thread | None = None
        self._brokers = order(mqtt.addresses(), topics.device)
        self._backoff = Backoff(
            RECONNECT_FIRST_S,
            float(mqtt.reconnect_max_s),
            jitter=random.Random() if jitter is None else jitter,
            now=now,
            round_of=len(self._brokers),
        )
        self._handshake_until = self._next_misc = now
        self._refusal = ""
        # Only the last line is remembered (limit 1): another failure is warned at once.
        self._warnings: Repeats[str] = Repeats(WARN_EVERY_S, limit=1)
        self._now = now
        self._spooled = 0
        self._turn = 0
        self.broker: Broker = self._brokers[0]
        """The broker of the attempt under way or of the connection (the next one when idle)."""

    @property
    def connected(self) -> bool:
        return self.state == "connected"

    @property
    def address(self) -> str:
        return str(self.broker)

    def step(self, now: float, spooled: int) -> float:
        """Move the connection on; returns when it next needs a step."""
        self._now, self._spooled = now, spooled
        while not self._results.empty():
            generation, client, error = self._results.get()
            if generation != self._generation:
                _close(client)
            elif client is None:
                self._failed(error)
            else:
                self.client, self.state = client, "handshake"
                self._handshake_until = now + max(10.0, self.mqtt.keepalive_s)
        if self.state == "idle" and now >= self._backoff.next_at:
            self._attempt()
        elif self.state == "handshake" and now >= self._handshake_until:
            self._drop()
            self._failed("no CONNACK from the broker")
        if self.client is not None and now >= self._next_misc:
            # Keepalive: PINGREQ after keepalive_s without traffic, loss if PINGRESP does not
            # come. A quarter of keepalive_s is fine enough (the broker allows 1.5 x) and
            # spares a wake-up per second per board.
            self.client.loop_misc()
            self._next_misc = now + self.mqtt.keepalive_s / 4
        if self.state == "idle":
            return self._backoff.next_at
        if self.state == "handshake":
            return min(self._handshake_until, self._next_misc)
        return self._next_misc if self.client is not None else now + 1.0

    def wait(self, timeout: float, wake: socket.socket) -> bool:
        """Wait for the socket or a wake-up and do the I/O; True if woken."""
        sock = self.client.socket() if self.client is not None else None
        if self.client is None or not isinstance(sock, socket.socket):
            return bool(poll({wake.fileno(): select.POLLIN}, timeout))
        pending = sock.pending() if hasattr(sock, "pending") else 0  # TLS bytes already read
        mask = select.POLLIN | (select.POLLOUT if self.client.want_write() else 0)
        ready = poll({wake.fileno(): select.POLLIN, sock.fileno(): mask}, 0 if pending else timeout)
        events = ready.get(sock.fileno(), 0)
        if (events & ~select.POLLOUT or pending) and self.client is not None:
            self.client.loop_read()  # also for POLLHUP/POLLERR: paho then notices the loss
        if events & select.POLLOUT and self.client is not None:
            self.client.loop_write()
        return wake.fileno() in ready

    def flush_writes(self) -> None:
        """Write what publish() queued from inside a callback, where paho defers the write."""
        if self.client is not None and self.client.want_write():
            self.client.loop_write()

    def close(self, with_will: bool = False) -> None:
        """Say goodbye (MQTT 5: optionally asking the broker to send the Will) and let go."""
        self._generation += 1
        if self._connector is not None:
            self._connector.join(mqtt_client.CONNECT_TIMEOUT_S + 1)
        while not self._results.empty():
            _close(self._results.get()[1])
        client, self.client, self.state = self.client, None, "idle"
        v5 = self.mqtt.protocol == "5"
        _close(client, mqtt_client.disconnect_with_will() if with_will and v5 else None)

    # -- attempts --------------------------------------------------------------------------------

    def _attempt(self) -> None:
        self._generation += 1
        self._refusal = ""
        self.broker = self._brokers[self._turn % len(self._brokers)]
        self._turn += 1
        try:
            client = mqtt_client.client(self.mqtt, self.topics)
        except mqtt_client.ConnectError as exc:
            self._failed(str(exc))
            return
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        self.state = "connecting"
        self._connector = threading.Thread(
            target=self._connect,
            args=(client, self.broker, self._generation),
            name="mcpd-mqtt-connect",
        )
        self._connector.daemon = True
        self._connector.start()

    def _connect(self, client: paho.Client, broker: Broker, generation: int) -> None:
        try:
            mqtt_client.connect(client, self.mqtt, broker)
        except mqtt_client.ConnectError as exc:
            self._results.put((generation, None, str(exc)))
        except Exception as exc:  # a paho surprise must not end the retries
            self._results.put((generation, None, f"unexpected error: {exc!r}"))
        else:
            self._results.put((generation, client, ""))
        self._wake()

    def _retry_later(self) -> float:
        self._backoff.max_s = float(self.mqtt.reconnect_max_s)  # a reload may have changed it
        delay = self._backoff.failed(self._now)
        self.state = "idle"
        return delay

    def _failed(self, why: str) -> None:
        delay = self._retry_later()
        line = f"MQTT broker {self.address}: {why}"
        quiet = self._warnings.say(line, self._now) is None
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "%s; retrying in %.1f s (%d messages spooled)",
            line,
            delay,
            self._spooled,
        )

    def _drop(self) -> None:
        client, self.client, self.state = self.client, None, "idle"
        _close(client)

    # -- paho callbacks (run in the publisher's thread) -------------------------------------------

    def _on_connect(
        self, client: paho.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any
    ) -> None:
        if client is not self.client:
            return
        if reason.is_failure:
            self._refusal = f"refused the connection: {mqtt_client.refusal(reason)}"
            return  # paho closes the socket and calls on_disconnect
        self.state = "connected"
        self._backoff.succeeded(self._now)
        self._warnings.forget()
        log.info(
            "connected to MQTT broker %s as %s (MQTT %s); %d messages to deliver",
            self.address,
            mqtt_client.client_id(self.topics),
            self.mqtt.protocol,
            self._spooled,
        )
        self.facts.append(Connected())

    def _on_disconnect(
        self, client: paho.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any
    ) -> None:
        if client is not self.client:
            return
        was, self.client, self.state = self.state, None, "idle"
        if was == "connected":
            log.warning(
                "lost the connection to MQTT broker %s (%s); spooling until it is back",
                self.address,
                reason,
            )
            self.facts.append(Lost())
            self._retry_later()
        else:
            self._failed(self._refusal or f"closed the connection before CONNACK ({reason})")

    def _on_publish(
        self, client: paho.Client, _u: Any, mid: int, reason: ReasonCode, _p: Any
    ) -> None:
        if client is self.client:
            self.facts.append(Acked(mid, reason))

    def _on_message(self, client: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
        if client is self.client:
            self.facts.append(Received(message))


def poll(fds: dict[int, int], timeout: float) -> dict[int, int]:
    """fd -> events ready within `timeout` s. poll(2), not select(2): a process with many
    sockets (the fleet benchmark runs a thousand boards) has descriptors past FD_SETSIZE."""
    poller = select.poll()
    for fd, mask in fds.items():
        poller.register(fd, mask)
    return dict(poller.poll(max(0.0, timeout) * 1000))


def _close(client: paho.Client | None, reason: ReasonCode | None = None) -> None:
    if client is None:
        return
    sock = client.socket()
    with suppress(Exception):  # best effort: the connection may be half gone already
        client.disconnect(reasoncode=reason)
    if sock is not None:
        sock.close()
