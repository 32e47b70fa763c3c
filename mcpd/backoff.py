"""How long to wait before trying again what keeps failing.

Pure, as the policies in governors/ are: no clock (the caller passes `now`), no I/O, and the jitter
drawn from a random source the caller hands in, so a test walks a whole schedule in microseconds.
Two things in the governor retry by it: the serving process's restarts (mcpd.governor.supervisor)
and the connection to the MQTT broker (mcpd.telemetry.link).
"""

from __future__ import annotations

import random


class Backoff:
    """The first `at_once` failures in a row are retried at once; each one after that waits
    `first_s`, doubling up to `max_s`, until a success starts the count again. With `jitter`, each
    delay is drawn from the upper half of its nominal value, so that many that failed at the same
    moment (a fleet that lost its broker) do not all come back at the same moment. With
    `round_of` N, the delay doubles after every N failures rather than each: a board with N
    brokers tries each of them at one delay before it waits longer, since one node refusing it says
    nothing of the others."""

    def __init__(
        self,
        first_s: float,
        max_s: float,
        *,
        at_once: int = 0,
        jitter: random.Random | None = None,
        now: float = 0.0,
        round_of: int = 1,
    ) -> None:
        self.first_s = first_s
        self.max_s = max_s
        """Read at each failure: the owner may change it (a reload)."""
        self.at_once = at_once
        self.round_of = max(1, round_of)
        self.jitter = jitter
        self.failures = 0
        """In a row, since the last success."""
        self.next_at = now
        """When the next attempt is due."""
        self._nominal = first_s
        """The next delay before jitter: doubled after each delay rather than computed as a power
        of two, which is no float beyond 2 ** 1023 (1 026 quick exits of the serving process)."""

    def failed(self, now: float) -> float:
        """One more failure, at `now`: the delay until the next attempt."""
        self.failures += 1
        delay = 0.0
        if self.failures > self.at_once:
            delay = self._nominal
            if self.jitter is not None:
                delay *= self.jitter.uniform(0.5, 1.0)
            if (self.failures - self.at_once) % self.round_of == 0:
                self._nominal = min(self._nominal * 2, self.max_s)
        self.next_at = now + delay
        return delay

    def succeeded(self, now: float) -> None:
        """A success, at `now`: the count starts again, and nothing waits."""
        self.failures = 0
        self._nominal = self.first_s
        self.next_at = now


class Restarts:
    """When to start again a process that exits, whatever the reason: at once after a run of
    `stable_s` or more (any crash loop is over), else when `backoff` says."""

    def __init__(self, backoff: Backoff, stable_s: float) -> None:
        self.backoff = backoff
        self.stable_s = stable_s

    def exited(self, ran_s: float, now: float) -> float:
        """The delay before starting again a process that ran `ran_s` and exited at `now`."""
        if ran_s >= self.stable_s:
            self.backoff.succeeded(now)
            return 0.0
        return self.backoff.failed(now)
