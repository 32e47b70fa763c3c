"""The publisher: one thread that samples telemetry, owns the spool and talks to the broker.

Other threads only put items in its inbox and wake it through a socket pair (`submit`,
`reconfigure`, `stop`): nothing a control loop or an inference worker calls can wait on a broker.
Each step: take the inbox (events into the spool), sample when the period is due, move the link
on, hand the oldest spooled messages to the broker (at most WINDOW in flight), journal what has to
wait, then sleep until the next deadline or socket activity. A message leaves the spool only when
the broker acknowledges it; after a reconnect, delivery starts again from the oldest message
still owed, so everything spooled goes out in order before anything newer.
"""

from __future__ import annotations

import logging
import queue
import select
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho

from mcpd.config import MqttSection
from mcpd.events import Event
from mcpd.status import MqttDoc, StatusDocument
from mcpd.telemetry import commands, encoder, homeassistant, inbound, mqtt_client
from mcpd.telemetry.journal import Message
from mcpd.telemetry.link import Acked, Connected, Link, Lost, Received, poll
from mcpd.telemetry.liveness import Liveness
from mcpd.telemetry.spool import Spool
from mcpd.telemetry.topics import Topics
from sensors.episodes import Repeats

log = logging.getLogger("mcpd.telemetry")

StatusSource = Callable[[], StatusDocument]
FLUSH_S = 2.0
"""At stop, how long to keep delivering the spool; what is left stays on disk for the next run."""
OFFLINE_ACK_S = 1.0
STOP_S = FLUSH_S + OFFLINE_ACK_S + mqtt_client.CONNECT_TIMEOUT_S + 2.0
MAX_EVENT_BYTES = 64 * 1024
"""An event is a line for people and a few details; a larger one (the serving process may send
anything) is dropped rather than take the room of hundreds of others, in memory and on disk."""
_STOP = object()


class Publisher:
    def __init__(
        self,
        mqtt: MqttSection,
        device: str,
        spool_path: Path | None,
        status: StatusSource,
        run_command: commands.Runner | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        delivered: Callable[[Message], None] | None = None,
    ) -> None:
        """`delivered`, if given, is told of each spooled message the broker acknowledged, on the
        publisher's thread (a bench counts what a board may forget: bench/cluster_boards.py)."""
        self.mqtt = mqtt
        self.topics = Topics(mqtt.topic_prefix, device)
        self._spool_path = spool_path
        self._status = status
        v5 = mqtt.protocol == "5"
        self._inbound = inbound.Inbound(self.topics, mqtt.homeassistant_prefix, run_command, v5)
        self._clock = clock
        self._delivered = delivered
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="mcpd-telemetry", daemon=True)
        # Everything below belongs to the thread.
        self._stopping = False
        self._cursor = 0
        """Id of the last spooled message handed to the broker on this connection."""
        self._inflight: dict[int, int] = {}
        """paho message id -> spooled message id."""
        self._rate = encoder.RequestRate()
        self._last_status: StatusDocument | None = None
        self._discovered = homeassistant.Published()
        self._liveness = Liveness(self.topics, mqtt, wall)
        self._spool: Spool
        self._link: Link
        self._next_tick = 0.0
        self._warned: Repeats[str] = Repeats(60.0)
        self._properties()

    # -- any thread ------------------------------------------------------------------------------

    @property
    def connection(self) -> MqttDoc:
        """Which broker the board is on and since when, for the status document."""
        return self._liveness.connection

    def start(self) -> None:
        self._thread.start()

    def submit(self, event: Event) -> None:
        """Queue an event for the broker; never blocks (EventBus subscribers must not)."""
        self._post(event)

    def reconfigure(self, mqtt: MqttSection) -> None:
        """Apply settings that need no new connection (see service.LIVE)."""
        self._post(mqtt)

    def stop(self, timeout: float = STOP_S) -> None:
        """Flush briefly, publish `offline`, disconnect, leave the rest of the spool on disk."""
        self._post(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("telemetry publisher did not stop within %g s", timeout)
            return
        self._wake_r.close()
        self._wake_w.close()

    def _post(self, item: object) -> None:
        self._inbox.put(item)
        self._wake()

    def _wake(self) -> None:
        # Full: a wake-up is already pending. Closed: stopped.
        with suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        now = self._clock()
        self._spool = Spool.open(self._spool_path, self.mqtt.spool_messages, self._clock)
        self._link = Link(self.mqtt, self.topics, self._wake, now)
        self._next_tick = now
        while not self._stopping:
            try:
                self._step()
            except Exception:  # a bug here must not end telemetry, and never the daemon
                self._warn("bug", "telemetry publisher: unexpected error; carrying on", True)
                poll({self._wake_r.fileno(): select.POLLIN}, 1.0)
        try:
            self._shutdown()
        except Exception:
            log.exception("telemetry publisher: error while stopping")

    def _step(self) -> None:
        now = self._clock()
        self._take_inbox()
        if self._stopping:
            return
        if now >= self._next_tick:
            self._sample()
            period = self.mqtt.telemetry_ms / 1000
            self._next_tick += period
            if self._next_tick <= now:  # fell behind (suspend, clock jump): skip, don't burst
                self._next_tick = now + period
        link_due = self._link.step(now, len(self._spool))
        self._take_facts()
        if self._link.connected and now >= self._liveness.next_at:
            self._liveness.online(self._send, now)
        self._pump()
        self._spool.persist(self._cursor)
        now = self._clock()
        due = min(self._next_tick, link_due, self._inbound.due(now))
        if self._link.connected:
            due = min(due, self._liveness.next_at)
        self._wait(due - now)

    def _wait(self, timeout: float) -> None:
        if self._link.wait(max(0.0, timeout), self._wake_r):
            try:
                while self._wake_r.recv(4096):
                    pass
            except BlockingIOError:
                pass
        self._take_facts()

    def _take_inbox(self) -> None:
        while not self._inbox.empty():
            item = self._inbox.get()
            if item is _STOP:
                self._stopping = True
            elif isinstance(item, Event):
                payload = encoder.event(item, device=self.topics.device)
                if len(payload) <= MAX_EVENT_BYTES:
                    self._spool.add("event", payload, item.kind)
                else:
                    size = f"{len(payload)} bytes, at most {MAX_EVENT_BYTES}"
                    self._warn("large event", f"telemetry: a {item.kind!r} event dropped ({size})")
            elif isinstance(item, MqttSection):
                self._apply(item)

    def _sample(self) -> None:
        try:
            status = self._status()
            payload = encoder.telemetry(
                status,
                device=self.topics.device,
                seq=self._spool.next_seq(),
                requests_per_s=self._rate(status),
                queued=len(self._spool),
                dropped=self._spool.dropped,
            )
        except Exception as exc:  # the daemon's document: a bug there must not stop telemetry
            self._warn("status", f"telemetry: no usable status document ({exc!r}); sample skipped")
            return
        self._last_status = status
        self._spool.add("telemetry", payload)
        self._discover()

    def _pump(self) -> None:
        client = self._link.client
        while (
            self._link.connected and client is not None and len(self._inflight) < mqtt_client.WINDOW
        ):
            message = self._spool.first_after(self._cursor)
            if message is None:
                return
            if message.kind == "telemetry":
                topic, qos, properties = self.topics.telemetry, self.mqtt.qos, self._telemetry_props
            else:
                topic, qos, properties = self.topics.events, 1, self._event_props
            info = client.publish(topic, message.payload, qos, properties=properties)
            if info.rc != paho.MQTT_ERR_SUCCESS:
                return  # the connection just went; Lost follows
            self._cursor = message.id
            self._inflight[info.mid] = message.id

    def _take_facts(self) -> None:
        facts, self._link.facts = self._link.facts, []
        for fact in facts:
            if isinstance(fact, Connected):
                self._connected()
            elif isinstance(fact, Lost):
                self._liveness.lost()
                self._cursor = 0
                self._inflight.clear()
                self._inbound.lost()
            elif isinstance(fact, Acked):
                self._acked(fact)
            elif isinstance(fact, Received):
                self._received(fact.message)
        self._listen()
        self._link.flush_writes()

    def _connected(self) -> None:
        self._cursor = 0
        self._inflight.clear()
        self._liveness.connected(self._link.address, self._send, self._clock())
        self._inbound.connected()
        self._listen()
        self._discover(force=True)

    def _listen(self) -> None:
        client = self._link.client
        if client is not None and self._link.connected:
            self._inbound.follow(client, self._clock(), self.mqtt)

    def _acked(self, fact: Acked) -> None:
        self._inbound.acked(fact.mid)
        self._liveness.acked(fact.mid, fact.reason)
        ident = self._inflight.pop(fact.mid, None)
        if ident is None:
            return
        message = self._spool.remove(ident)
        if fact.reason.is_failure:
            self._warn("refused", f"the broker refused a message ({fact.reason}); dropped")
        elif message is not None and self._delivered is not None:
            self._delivered(message)

    def _received(self, message: paho.MQTTMessage) -> None:
        heard = self._inbound.heard(message, self._clock())
        if isinstance(heard, inbound.Rediscover):
            self._discover(force=True)
        elif heard is not None:
            self._inbound.sent(self._send(heard.topic, heard.payload, properties=heard.properties))

    def _discover(self, force: bool = False) -> None:
        """Keep Home Assistant's retained configs in step with the board (and with the setting)."""
        if not self._link.connected or self._last_status is None:
            return
        wanted = {}
        if self.mqtt.homeassistant_discovery:
            period_s = self.mqtt.telemetry_ms / 1000
            prefix = self.mqtt.homeassistant_prefix
            wanted = homeassistant.configs(self._last_status, self.topics, prefix, period_s)
        for topic, payload in self._discovered.update(wanted, force):
            self._send(topic, payload, retain=True)

    def _send(
        self, topic: str, payload: bytes, retain: bool = False, properties: Any = None
    ) -> int | None:
        """Publish outside the spool (state, not data: it is sent again on every connection)."""
        client = self._link.client
        if client is None:
            return None
        info = client.publish(topic, payload, qos=1, retain=retain, properties=properties)
        return info.mid if info.rc == paho.MQTT_ERR_SUCCESS else None

    def _apply(self, mqtt: MqttSection) -> None:
        self.mqtt = self._link.mqtt = mqtt
        self._spool.resize(mqtt.spool_messages)
        self._properties()
        self._liveness.configure(mqtt, self._clock())
        self._next_tick = min(self._next_tick, self._clock() + mqtt.telemetry_ms / 1000)
        self._listen()
        self._discover()
        log.info("telemetry settings applied")

    def _properties(self) -> None:
        v5 = self.mqtt.protocol == "5"
        expiry = self.mqtt.message_expiry_s
        self._telemetry_props = mqtt_client.publish_properties(expiry) if v5 else None
        self._event_props = mqtt_client.publish_properties(None) if v5 else None

    def _shutdown(self) -> None:
        until = self._clock() + FLUSH_S
        while self._link.connected and len(self._spool) and self._clock() < until:
            self._pump()
            self._wait(min(0.1, until - self._clock()))
        if self._link.connected:
            self._liveness.offline(self._send)
            until = self._clock() + OFFLINE_ACK_S
            while (
                self._link.connected and not self._liveness.offline_acked and self._clock() < until
            ):
                self._wait(min(0.1, until - self._clock()))
        # If our own `offline` did not make it, MQTT 5 lets us ask the broker for the Will.
        self._link.close(with_will=not self._liveness.offline_acked)
        self._spool.close()
        log.info("telemetry stopped; %d messages left in the spool", len(self._spool))

    def _warn(self, key: str, message: str, traceback: bool = False) -> None:
        """Log a repeating problem once a minute at most, with how many times it went unsaid."""
        unsaid = self._warned.say(key, self._clock())
        if unsaid is not None:
            more = f" ({unsaid} more since the last such line)" if unsaid else ""
            log.warning("%s%s", message, more, exc_info=traceback)
