"""The brokers a board may use (`[mqtt] brokers`, or `host`/`port` as a list of one) and the order
in which it tries them.

paho-mqtt connects to one host per `connect` (eclipse-paho/paho.mqtt.python#477: a server list is
"not something the library supports"), so the link picks the next broker of this order at each
attempt. The order is the configured list shuffled with the device id as the seed: every board of a
fleet given the same list starts on a broker of its own and, when its broker goes, moves on to a
next one of its own, so a lost node's boards spread over the others instead of all landing on the
second entry. Pure: no I/O, no clock; the seed is the id, so a board keeps its order across restarts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

DEFAULT_PORT = 1883
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
"""RFC 1123 host names (IPv4 addresses are among them)."""
_IPV6 = re.compile(r"^[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?$")


@dataclass(frozen=True)
class Broker:
    host: str
    """A host name (TLS checks the broker's certificate against it), or an IPv4 or IPv6 address."""
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse(text: str) -> Broker:
    """HOST:PORT, with HOST a host name, an IPv4 address or an [IPv6] address in brackets;
    ValueError saying what is wrong otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not host:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. broker-1.lan:1883)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        valid = ":" in host and bool(_IPV6.match(host))
    elif ":" in host:
        raise ValueError(f"{text!r}: an IPv6 address goes in brackets, e.g. [fd00::1]:1883")
    else:
        valid = bool(_HOST_NAME.match(host))
    if not valid:
        raise ValueError(f"{text!r}: {host!r} is not a host name or an IP address")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return Broker(host, int(port))


def order(brokers: tuple[Broker, ...], device: str) -> tuple[Broker, ...]:
    """`brokers` in the order this device tries them: shuffled, seeded by the device id."""
    shuffled = list(brokers)
    # A str seed is hashed with SHA-512 (random.seed, version 2): the same order in every run,
    # unlike hash(), which is salted per process.
    random.Random(device).shuffle(shuffled)
    return tuple(shuffled)
