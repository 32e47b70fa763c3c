"""Which board this is on the broker, and the topics it uses there.

The default device id comes from /etc/machine-id, hashed with an mcpd-specific key as systemd's
`sd_id128_get_machine_app_specific()` does: machine-id(5) says the id itself is confidential and
must not go out on the network, but a keyed hash of it is stable and unique just the same.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from safefs import read_text

MACHINE_ID = Path("/etc/machine-id")
_APP_KEY = b"mcpd telemetry device id v1"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def device_id(
    configured: str,
    machine_id: Path = MACHINE_ID,
    hostname: Callable[[], str] = socket.gethostname,
) -> str:
    """The configured id; else a hash of the machine id; else the short hostname, made topic-safe."""
    if configured:
        return configured
    try:
        text = read_text(machine_id).strip()  # never blocks (a FIFO), never more than a page
        raw = bytes.fromhex(text)
    except (OSError, ValueError):
        raw = b""
    if len(raw) == 16:
        return hmac.new(raw, _APP_KEY, hashlib.sha256).hexdigest()[:16]
    name = _UNSAFE.sub("-", hostname().split(".", 1)[0]).strip("-")
    return name or "mcpd"


@dataclass(frozen=True)
class Topics:
    prefix: str
    device: str

    @property
    def base(self) -> str:
        return f"{self.prefix}/{self.device}"

    @property
    def status(self) -> str:
        return f"{self.base}/status"

    @property
    def telemetry(self) -> str:
        return f"{self.base}/telemetry"

    @property
    def events(self) -> str:
        return f"{self.base}/events"

    @property
    def commands(self) -> str:
        """The subscription: one level under cmd/, so replies (cmd/<name>/reply) never match it."""
        return f"{self.base}/cmd/+"

    def command_name(self, topic: str) -> str | None:
        head, _, name = topic.rpartition("/")
        return name if head == f"{self.base}/cmd" else None

    def reply(self, command: str) -> str:
        return f"{self.base}/cmd/{command}/reply"
