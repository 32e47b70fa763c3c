"""systemd's notify protocol (sd_notify(3)): READY, STATUS, WATCHDOG, RELOADING, STOPPING.

A few lines of standard library instead of a dependency: one datagram per message to the socket in
$NOTIFY_SOCKET (a path, or an abstract name written with a leading '@'). Outside systemd the variable
is unset and every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("mcpd.governor.notify")


class Notifier:
    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        address = environ.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._socket: socket.socket | None = None
        if self._address:
            # Non-blocking: a receiver that stops reading (a full datagram queue) must cost a
            # dropped message, never a control loop stuck in sendto().
            self._socket = socket.socket(
                socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
            )
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        enabled = usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid()))
        # sd_watchdog_enabled(3): ping at half the interval.
        self.watchdog_interval_s: float | None = int(usec) / 2e6 if enabled else None

    def send(self, message: str) -> None:
        if self._socket is None:
            return
        try:
            self._socket.sendto(message.encode(), self._address)
        except OSError as exc:  # systemd gone or restarting: nothing to do but carry on
            log.debug("notify %r failed: %s", message, exc)

    def ready(self, status: str | None = None) -> None:
        self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def reloading(self) -> None:
        # MONOTONIC_USEC is required with RELOADING=1 by systemd >= 253 (Type=notify-reload).
        self.send(
            f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"
        )

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
