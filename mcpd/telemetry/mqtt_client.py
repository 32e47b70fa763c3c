"""One connection to the broker: a fresh paho client per attempt, built from `[mqtt]`.

A fresh client per connection (rather than paho's own reconnect) means paho never holds messages
across a reconnect: it re-sends its unacknowledged QoS 1 messages itself after a reconnect, in
memory only and racing whatever is published next, while the spool already owns them and re-sends
them in order. The client runs without paho's thread; the publisher drives its socket.
"""

from __future__ import annotations

import os
import socket
import ssl

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from mcpd.brokers import Broker
from mcpd.config import MqttSection
from mcpd.telemetry.topics import Topics
from safefs import open_regular

WINDOW = 20
"""Messages in flight at once (paho's and mosquitto's default Receive Maximum)."""
QUEUED = 256
"""QoS 1 messages paho holds at most, sent or waiting to be: the spool's WINDOW, the command topic's
answers (commands.ANSWERS_IN_FLIGHT) and state (status, a few discovery configs) stay far below
it; the bound is there so that nothing can grow paho's memory (a publish beyond it fails, and the
spool sends the message again later)."""
CONNECT_TIMEOUT_S = 5.0

_HINTS = {
    "Bad user name or password": "check [mqtt] username and password_file",
    "Not authorized": "check [mqtt] username and password_file, and the broker's ACLs",
    "Client identifier not valid": "check [mqtt] device_id",
    "Unsupported protocol version": 'try [mqtt] protocol = "3.1.1"',
}


_MAX_PASSWORD_BYTES = 65535  # MQTT's limit for the password field (MQTT 5, 1.5.6)


class ConnectError(Exception):
    """A connection attempt failed; the message says why, for the log."""


def _password(path: str) -> str:
    try:
        fd = open_regular(path)  # a FIFO there must not hang the telemetry thread
        try:
            password = os.read(fd, _MAX_PASSWORD_BYTES).decode("utf-8").rstrip("\r\n")
        finally:
            os.close(fd)
    except OSError as exc:
        why = exc.strerror or exc
        raise ConnectError(f"cannot read [mqtt] password_file {path}: {why}") from None
    except UnicodeDecodeError:
        raise ConnectError(f"[mqtt] password_file {path} is not UTF-8 text") from None
    if not password:
        raise ConnectError(f"[mqtt] password_file {path} is empty")
    return password


def client_id(topics: Topics) -> str:
    """Unique per board: a broker drops the older of two connections with the same id."""
    return f"mcpd-{topics.device}"


def client(mqtt: MqttSection, topics: Topics) -> paho.Client:
    v5 = mqtt.protocol == "5"
    result = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id(topics),
        protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
        clean_session=None if v5 else True,
        reconnect_on_failure=False,
    )
    result.connect_timeout = CONNECT_TIMEOUT_S
    result.max_inflight_messages_set(WINDOW)
    result.max_queued_messages_set(QUEUED)
    result.will_set(topics.status, "offline", qos=1, retain=True)
    if mqtt.username:
        password = _password(mqtt.password_file) if mqtt.password_file else None
        result.username_pw_set(mqtt.username, password)
    if mqtt.tls.enabled:
        result.tls_set_context(_tls_context(mqtt))
    return result


class _SSLSocket(ssl.SSLSocket):
    """Closes itself when the handshake fails: paho 2.2 drops the socket without closing it."""

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except BaseException:
            self.close()
            raise


def _tls_context(mqtt: MqttSection) -> ssl.SSLContext:
    """Verify the broker (certificate and host name) against ca_file, else the system's CAs."""
    try:
        context = ssl.create_default_context(cafile=mqtt.tls.ca_file or None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if mqtt.tls.cert_file:
            context.load_cert_chain(mqtt.tls.cert_file, mqtt.tls.key_file or None)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConnectError(f"[mqtt.tls] files unusable: {exc}") from None
    context.sslsocket_class = _SSLSocket
    return context


def connect(client: paho.Client, mqtt: MqttSection, broker: Broker) -> None:
    """Open the socket to `broker` and send CONNECT (blocking, up to CONNECT_TIMEOUT_S); CONNACK
    comes later. With TLS, paho checks the certificate against the host given here
    (server_hostname), so each broker of a list is checked against its own name."""
    try:
        if mqtt.protocol == "5":
            client.connect(broker.host, broker.port, mqtt.keepalive_s, clean_start=True)
        else:
            client.connect(broker.host, broker.port, mqtt.keepalive_s)
        sock = client.socket()
        if isinstance(sock, socket.socket) and sock.family != socket.AF_UNIX:
            # Telemetry is a trickle of small messages: send each at once rather than wait for
            # Nagle to fill a segment.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except ssl.SSLCertVerificationError as exc:
        raise ConnectError(
            f"TLS: broker certificate not trusted ({exc.verify_message}); check [mqtt.tls] ca_file"
        ) from None
    except ssl.SSLError as exc:
        raise ConnectError(f"TLS handshake failed ({exc.reason or exc})") from None
    except socket.gaierror as exc:
        raise ConnectError(f"cannot resolve {broker.host!r} ({exc.strerror})") from None
    except TimeoutError:
        raise ConnectError(f"no answer within {CONNECT_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise ConnectError(exc.strerror or str(exc)) from None


def refusal(reason: ReasonCode) -> str:
    """A CONNACK refusal in words, with what to check."""
    name = reason.getName()
    hint = _HINTS.get(name)
    return f"{name} ({hint})" if hint else name


def publish_properties(
    expiry_s: int | None, content_type: str | None = "application/json"
) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if content_type is not None:
        properties.ContentType = content_type
    if expiry_s:
        properties.MessageExpiryInterval = expiry_s
    return properties


def disconnect_with_will() -> ReasonCode:
    """MQTT 5 DISCONNECT reason 0x04: the broker sends the Will (offline) although we said bye."""
    return ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message")
