"""From the broker's deliveries to requests the store accepted.

One thread runs it (mcpd/ctl/ingest.py): it takes what the broker delivered, drops what is not
telemetry and what was already taken (`(device, seq)`, mcpd/ctl/ingest_window.py), writes the rest
in one request and only then lets the deliveries be acknowledged. A request that fails (5xx, 429,
no answer) is sent again after a backoff, for as long as it takes: meanwhile nothing is
acknowledged, so the broker stops sending at the client's Receive Maximum and keeps the rest. A
request the store refuses (4xx: one out-of-order sample makes a Prometheus refuse it whole) is
split in two and each half sent, down to single messages: only those the store refuses alone are
dropped (counted, logged), not the fleet's messages that shared a request with them.

No network and no clock of its own: the store is a `send` function, time and sleeping are
handed in, so tests drive it directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from mcpd.backoff import Backoff
from mcpd.ctl import ingest_samples, ingest_topics
from mcpd.ctl.ingest_batch import Templates, encode
from mcpd.ctl.ingest_metrics import Counters
from mcpd.ctl.ingest_samples import Message, NotTelemetry
from mcpd.ctl.ingest_window import SeqWindow
from mcpd.ctl.remote_write import Outcome

log = logging.getLogger("mcpctl.ingest")


@dataclass(frozen=True)
class Delivery:
    topic: str
    payload: bytes
    mid: int
    qos: int
    connection: int
    """Which connection to the broker it came on: a packet id means nothing on another."""


class Writer:
    def __init__(
        self,
        prefix: str,
        send: Callable[[bytes], Outcome],
        templates: Templates,
        counters: Counters,
        *,
        wall: Callable[[], float],
        monotonic: Callable[[], float],
        wait: Callable[[float], bool],
        backoff: Backoff,
    ) -> None:
        """`wait(seconds)` sleeps and says whether to stop (True: stop now)."""
        self.prefix = prefix
        self.send = send
        self.templates = templates
        self.counters = counters
        self.window = SeqWindow()
        self.wall = wall
        self.monotonic = monotonic
        self.wait = wait
        self.backoff = backoff

    def messages(self, deliveries: list[Delivery]) -> list[Message]:
        """What of `deliveries` is to be written: telemetry not taken before, and status changes."""
        taken = []
        now = self.wall()
        for delivery in deliveries:
            board = ingest_topics.board(delivery.topic, self.prefix)
            if board is None:
                self.counters.invalid += 1
                continue
            device, leaf = board
            if leaf == ingest_topics.STATUS:
                change = ingest_samples.status(device, delivery.payload, now)
                if change is not None:
                    taken.append(change)
                continue
            try:
                message = ingest_samples.telemetry(device, delivery.payload)
            except NotTelemetry as exc:
                self.counters.invalid += 1
                log.debug("%s: %s", delivery.topic, exc)
                continue
            if message.seq is not None and not self.window.first_time(device, message.seq):
                self.counters.duplicates += 1
                log.debug("%s seq %d: taken before", device, message.seq)
                continue
            taken.append(message)
        return taken

    def write(self, messages: list[Message]) -> bool:
        """Write `messages` until the store has accepted or refused each; False if told to stop
        before (then the caller acknowledges nothing, and the broker keeps them)."""
        if not messages:
            return True
        while True:
            outcome = self.send(encode(messages, self.templates))
            if outcome.verdict == "accepted":
                self.backoff.succeeded(self.monotonic())
                self._accepted(messages)
                return True
            if outcome.verdict == "rejected":
                self.counters.write_rejections += 1
                if len(messages) == 1:
                    self.counters.rejected += 1
                    log.warning(
                        "the store refused %s's message: %s", messages[0].device, outcome.detail
                    )
                    return True
                half = len(messages) // 2
                return self.write(messages[:half]) and self.write(messages[half:])
            self.counters.write_failures += 1
            delay = self.backoff.failed(self.monotonic())
            log.warning("remote write failed (%s); again in %.1f s", outcome.detail, delay)
            if self.wait(delay):
                return False

    def _accepted(self, messages: list[Message]) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("written: %s", " ".join(f"{m.device}:{m.seq}:{m.ts_ms}" for m in messages))
        self.counters.written += len(messages)
        self.counters.samples += sum(len(m.values) for m in messages)
        self.counters.lag_s = round(self.wall() - max(m.ts_ms for m in messages) / 1000, 3)
