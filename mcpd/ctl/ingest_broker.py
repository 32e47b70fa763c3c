"""`mcpctl ingest`'s side of the broker: a persistent session, flow control, late acknowledgements.

- A persistent session (a fixed client id, Clean Start 0, Session Expiry SESSION_EXPIRY_S): while
  the process restarts, the broker keeps what it would have been sent, and sends again what it
  sent but never had acknowledged (MQTT 5 §4.4). In a shared group on mosquitto a member's share
  waits for it in its session; it is not handed to another member (docs/ingest.md §3).
- Acknowledgements only after the write (paho's `manual_ack`): a message the store has not taken
  is never acknowledged, so whatever kills the process, the broker still has it.
- Flow control as the bounded queue: the client's Receive Maximum (MQTT 5 §4.9) is RECEIVE_MAXIMUM,
  the queue's size, so the broker stops sending when that many wait unacknowledged: the store's
  pace reaches the broker without the network thread ever blocking.
- `--broker` given several times: tried in turn. A connection that fails moves on to the next one;
  one that drops is tried again first (the session is there).

A fresh paho client per connection, as the daemon's link does (mcpd/telemetry/mqtt_client.py): a
packet id is acknowledged only on the connection it came on (Delivery.connection).
"""

from __future__ import annotations

import logging
import queue
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from mcpd.backoff import Backoff
from mcpd.ctl import paho_thread
from mcpd.ctl.ingest_topics import NoSharedSubscriptions, subscriptions
from mcpd.ctl.ingest_writer import Delivery

log = logging.getLogger("mcpctl.ingest")

RECEIVE_MAXIMUM = 10_000
"""Messages the broker may send before one is acknowledged: 5 s of a 2 000-board fleet at 1 Hz."""
SESSION_EXPIRY_S = 3600
"""How long the broker keeps the session of a member that is away; the boards' own
`message_expiry_s` (3600) bounds it too."""
KEEPALIVE_S = 30
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Access:
    """How to reach the brokers: `[(host, port)]` tried in turn, and the credentials."""

    brokers: list[tuple[str, int]]
    client_id: str
    username: str | None = None
    password_file: str | None = None
    ca_file: str | None = None
    protocol: str = "5"
    """"5", or "3.1.1" for a broker without MQTT 5 (RabbitMQ 3.10, NATS 2.9): a session kept
    for as long as the broker keeps it, the broker's own in-flight window instead of the Receive
    Maximum, and no shared subscriptions."""


class BrokerSide:
    def __init__(
        self,
        access: Access,
        prefix: str,
        group: str | None,
        deliveries: queue.Queue[Delivery],
        backoff: Backoff,
        monotonic: Callable[[], float],
    ) -> None:
        self.access = access
        self.prefix = prefix
        self.group = group
        self.deliveries = deliveries
        self.backoff = backoff
        self.monotonic = monotonic
        self.fatal: str | None = None
        """Why ingesting cannot go on (a group on a broker without shared subscriptions)."""
        self._lock = threading.Lock()
        self._client: paho.Client | None = None
        self._connection = 0

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge `delivery`, if its connection is still the one open (else the broker
        sends it again on the next, and the writer finds it already taken)."""
        if delivery.qos == 0:
            return
        with self._lock:
            if self._client is not None and delivery.connection == self._connection:
                self._client.ack(delivery.mid, delivery.qos)

    def run(self, stopping: threading.Event) -> None:
        """Stay connected to one of the brokers until `stopping` is set (or a fatal refusal)."""
        turn = 0
        while not stopping.is_set():
            host, port = self.access.brokers[turn % len(self.access.brokers)]
            with self._lock:
                self._connection += 1
                number = self._connection
            if self._session(host, port, number, stopping):
                self.backoff.succeeded(self.monotonic())
            else:
                turn += 1
            if self.fatal is not None:
                stopping.set()
                return
            if not stopping.is_set():
                stopping.wait(self.backoff.failed(self.monotonic()))

    def _session(self, host: str, port: int, number: int, stopping: threading.Event) -> bool:
        """One connection, until it closes: True if it was up (the broker took the session)."""
        v5 = self.access.protocol == "5"
        client = self._new_client(v5)
        up, closed = threading.Event(), threading.Event()

        def on_connect(c: paho.Client, _u: Any, _f: Any, reason: ReasonCode, props: Any) -> None:
            if reason.is_failure:
                log.warning("%s:%d refused the connection: %s", host, port, reason.getName())
                closed.set()
                return
            # MQTT 5 §3.2.2.3.14: absent means available; MQTT 3.1.1 has none.
            shared = v5 and getattr(props, "SharedSubscriptionAvailable", 1) != 0
            try:
                topics = subscriptions(self.prefix, self.group, shared)
            except NoSharedSubscriptions as exc:
                self.fatal = f"{host}:{port}: {exc}"
                closed.set()
                return
            c.subscribe([(topic, 1) for topic in topics])
            log.info("connected to %s:%d, subscribed to %s", host, port, ", ".join(topics))
            up.set()

        def on_disconnect(_c: paho.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
            if up.is_set() and not stopping.is_set():
                log.warning("%s:%d closed the connection: %s", host, port, reason.getName())
            closed.set()

        client.on_connect = on_connect
        client.on_disconnect = on_disconnect

        def on_message(_c: paho.Client, _u: Any, m: paho.MQTTMessage) -> None:
            log.debug(
                "%s: mid %d%s, connection %d", m.topic, m.mid, " dup" if m.dup else "", number
            )
            delivery = Delivery(m.topic, bytes(m.payload), m.mid, m.qos, number)
            # The Receive Maximum keeps the queue from filling; should a broker send past it,
            # waiting here is the backpressure, but never past a stop (unacknowledged, the
            # message is sent again next time).
            while not stopping.is_set():
                try:
                    self.deliveries.put(delivery, timeout=0.5)
                    return
                except queue.Full:
                    continue

        client.on_message = on_message
        try:
            if v5:
                properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
                properties.SessionExpiryInterval = SESSION_EXPIRY_S
                properties.ReceiveMaximum = RECEIVE_MAXIMUM
                client.connect(host, port, KEEPALIVE_S, clean_start=False, properties=properties)
            else:
                client.connect(host, port, KEEPALIVE_S)
        except (OSError, ValueError, ssl.SSLError) as exc:
            log.warning("cannot connect to %s:%d: %s", host, port, exc)
            return False
        with self._lock:
            self._client = client
        client.loop_start()
        while not closed.wait(0.5) and not stopping.is_set():
            pass
        with self._lock:
            self._client = None
        paho_thread.close(client)
        return up.is_set()

    def _new_client(self, v5: bool) -> paho.Client:
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.access.client_id,
            protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
            clean_session=None if v5 else False,  # 3.1.1's persistent session
            reconnect_on_failure=False,
            manual_ack=True,
        )
        client.connect_timeout = CONNECT_TIMEOUT_S
        if self.access.username:
            password = None
            if self.access.password_file:
                password = Path(self.access.password_file).read_text().rstrip("\r\n")
            client.username_pw_set(self.access.username, password)
        if self.access.ca_file:
            client.tls_set(ca_certs=self.access.ca_file)
        return client
