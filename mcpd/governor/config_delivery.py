"""The configuration on its way to the serving process: numbered, and sent until acknowledged.

A configuration is never dropped. The channel may be full (it is sent at the next step), or may
have taken it without serving getting it (a memfd it had no descriptor for is dropped by the
kernel): it is sent again every RESEND_S until serving acknowledges its number. One that cannot be
sent at all (too big, no memfd to be had), or that serving refuses, is logged and kept as the
error the status shows (`serving.config_error`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

from mcpd.channel import Channel
from mcpd.config import Config
from mcpd.ipc import ConfigMessage, IpcError
from mcpd.status import PlacementDoc

log = logging.getLogger("mcpd.governor.supervisor")

RESEND_S = 5.0
"""How long a configuration the channel took waits for its acknowledgement before it is sent
again (serving answers at once: its event loop parses it on arrival)."""
ERROR_CHARS = 2000
"""Of a refusal the serving process sends, kept for the log and the status."""


class ConfigDelivery:
    def __init__(self, settled: Callable[[str | None], None]) -> None:
        self._settled = settled
        """Called when a configuration is taken (None) or cannot be (why), after `error` is set."""
        self.generation = 0
        """Configurations sent so far: each carries its number, and the acknowledgement names it."""
        self.configured = False
        """The serving process has taken a configuration (it has none until then)."""
        self.error: str | None = None
        """Why the serving process does not have the newest configuration, when it does not."""
        self._unacknowledged: ConfigMessage | None = None
        """The newest configuration, until the serving process acknowledges it."""
        self._sent_at: float | None = None
        """When the channel took it; None while it has not."""

    @property
    def resend_at(self) -> float | None:
        return None if self._sent_at is None else self._sent_at + RESEND_S

    def send(
        self,
        config: Config,
        slots: Mapping[str, int],
        placement: PlacementDoc,
        channel: Channel | None,
        now: float,
    ) -> None:
        """A new configuration, with the placement plan made for it: it replaces any not
        acknowledged yet."""
        self.generation += 1
        self._unacknowledged = {
            "kind": "config",
            "generation": self.generation,
            "config": dataclasses.asdict(config),
            "slots": dict(slots),
            "placement": placement,
        }
        self._sent_at = None
        self.deliver(channel, now)

    def deliver(self, channel: Channel | None, now: float) -> None:
        """Send the configuration not acknowledged yet: now if the channel has not taken it (it
        was full), again once RESEND_S has passed since it did."""
        if self._unacknowledged is None or channel is None:
            return
        if self._sent_at is not None and now - self._sent_at < RESEND_S:
            return
        try:
            if channel.send(self._unacknowledged):
                self._sent_at = now
        except IpcError as exc:
            self._unacknowledged, self._sent_at = None, None
            self._failed(f"configuration {self.generation} not sent: {exc}")

    def acknowledged(self, generation: int, error: str | None) -> None:
        if generation != self.generation:
            return  # an earlier configuration's; the newest one's is on its way
        self._unacknowledged, self._sent_at = None, None
        if error is None:
            self.configured = True
            self.error = None
            self._settled(None)
        else:
            refusal = error[:ERROR_CHARS]
            self._failed(f"the serving process refused configuration {generation}: {refusal}")

    def lost(self) -> None:
        """The serving process exited: the next one has no configuration, and is sent the newest
        when it starts."""
        self.configured, self._unacknowledged, self._sent_at = False, None, None

    def _failed(self, why: str) -> None:
        self.error = why
        log.error("%s", why)
        self._settled(why)
