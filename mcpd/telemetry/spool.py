"""Messages owed to the broker: bounded, in order, and on disk whenever they wait.

Every telemetry message and event goes through the spool and leaves it only when the broker has
acknowledged it (PUBACK for QoS 1, the socket write for QoS 0). A message handed to the broker at
once is never written to disk, so a healthy link costs no flash wear; one that has to wait (the
broker is away, slow, or the in-flight window is full) is journaled at the end of the publisher's
step. The journal is fsynced at most every `SYNC_S`: a crash of the daemon loses nothing journaled
(the page cache outlives the process), a power cut loses at most the last few seconds of it, and
a message in flight at a crash (sent, not yet acknowledged: at most the in-flight window) may be
lost. fsync per message would cost a flash write per second per board for no gain on the healthy
path, which is the common one.

When full, the oldest telemetry is dropped first and events only when no telemetry is left:
events are rare and each one matters, while the next telemetry message supersedes the last.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from mcpd.telemetry.journal import KINDS, Journal, Kind, Message, add_frame, done_frame, seq_frame

log = logging.getLogger("mcpd.telemetry")

SYNC_S = 5.0
SEQ_RESERVE = 1000
"""A crash skips at most this many `seq` values, and the journal records the reservation once per
this many telemetry messages."""


class Spool:
    """Owned by the publisher's thread; nothing here is thread-safe."""

    def __init__(self, capacity: int, journal: Journal | None, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.dropped = 0
        """Messages dropped for room since the daemon started."""
        self._journal = journal
        self._clock = clock
        self._queues: dict[Kind, OrderedDict[int, Message]] = {k: OrderedDict() for k in KINDS}
        self._journaled: set[int] = set()
        self._unjournaled: dict[int, None] = {}
        self._done: list[int] = []
        self._dead = 0
        self._next_id = 1
        self._seq = self._seq_limit = 0
        self._synced_at = clock()

    @classmethod
    def open(cls, path: Path | None, capacity: int, clock: Callable[[], float]) -> Spool:
        """The spool left at `path` by an earlier run (none: memory only)."""
        journal = replayed = None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                journal, replayed = Journal.open(path)
            except OSError as exc:
                log.error(
                    "telemetry spool %s unusable (%s): spooling in memory only until restart",
                    path, exc.strerror or exc,
                )  # fmt: skip
                journal = None
        spool = cls(capacity, journal, clock)
        if replayed is not None:
            spool._seq = spool._seq_limit = replayed.seq
            for message in replayed.messages.values():
                spool._queues[message.kind][message.id] = message
                spool._journaled.add(message.id)
                spool._next_id = message.id + 1
            if replayed.messages:
                log.info("telemetry spool: %d messages from the last run", len(replayed.messages))
            spool._evict()
        return spool

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        if self._seq > self._seq_limit:
            self._seq_limit = self._seq + SEQ_RESERVE
            self._append(seq_frame(self._seq_limit))
            self._dead += 1  # superseded by the next reservation or by a rewrite
        return seq

    def add(self, kind: Kind, payload: bytes) -> Message:
        message = Message(self._next_id, kind, payload)
        self._next_id += 1
        self._queues[kind][message.id] = message
        self._unjournaled[message.id] = None
        self._evict()
        return message

    def first_after(self, cursor: int) -> Message | None:
        """The oldest message with an id above `cursor` (the last one handed to the broker)."""
        best: Message | None = None
        for queue in self._queues.values():
            for message in queue.values():
                if message.id > cursor:
                    if best is None or message.id < best.id:
                        best = message
                    break
        return best

    def remove(self, ident: int) -> None:
        """Delivered (or dropped): forget it, on disk too."""
        for queue in self._queues.values():
            if queue.pop(ident, None) is not None:
                break
        else:
            return
        self._unjournaled.pop(ident, None)
        if ident in self._journaled:
            self._journaled.discard(ident)
            self._done.append(ident)

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        self._evict()

    def _evict(self) -> None:
        while len(self) > self.capacity:
            queue = self._queues["telemetry"] or self._queues["event"]
            self.remove(next(iter(queue)))
            self.dropped += 1

    def persist(self, cursor: int) -> None:
        """Journal what waits (ids above `cursor`), record deliveries; fsync and compact when due."""
        if self._journal is None:
            self._unjournaled.clear()
            return
        for ident in [i for i in self._unjournaled if i > cursor]:
            del self._unjournaled[ident]
            message = self._find(ident)
            self._append(add_frame(message))
            self._journaled.add(ident)
        if self._done:
            self._append(done_frame(self._done))
            self._dead += len(self._done) * 2
            self._done.clear()
        try:
            if self._dead and self._dead > 2 * len(self._journaled) + (
                1000 if self._journaled else 0
            ):
                self._rewrite(self._seq_limit)
            else:
                self._journal.flush()
                if self._journal.unsynced and self._clock() - self._synced_at >= SYNC_S:
                    self._journal.sync()
                    self._synced_at = self._clock()
        except OSError as exc:
            self._lose_journal(exc)

    def close(self) -> None:
        """Leave exactly what is owed, and the exact next seq, on disk."""
        if self._journal is None:
            return
        self._journaled.update(self._unjournaled)
        self._unjournaled.clear()
        try:
            self._rewrite(self._seq)
        except OSError as exc:
            self._lose_journal(exc)
            return
        self._journal.close()
        self._journal = None

    def _find(self, ident: int) -> Message:
        for queue in self._queues.values():
            if ident in queue:
                return queue[ident]
        raise KeyError(ident)

    def _append(self, frame: bytes) -> None:
        if self._journal is not None:
            self._journal.append(frame)

    def _rewrite(self, seq: int) -> None:
        assert self._journal is not None
        live = sorted(
            (m for q in self._queues.values() for m in q.values() if m.id in self._journaled),
            key=lambda m: m.id,
        )
        self._journal.rewrite(live, seq)
        self._dead = 0
        self._synced_at = self._clock()

    def _lose_journal(self, exc: OSError) -> None:
        assert self._journal is not None
        log.error(
            "telemetry spool %s: cannot write (%s); spooling in memory only until restart",
            self._journal.path, exc.strerror or exc,
        )  # fmt: skip
        self._journal.close()
        self._journal = None
