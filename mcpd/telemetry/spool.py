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

When full (`capacity` messages, or `MAX_BYTES` of payload: the bound on memory and on the live part
of the file), the oldest telemetry is dropped while telemetry holds at least as much as all events
together (events are rare and each one matters, while the next telemetry message supersedes the
last), else the oldest event of the kind that holds the most. So no event source can push out the
telemetry of an outage or the other kinds of event: a flood of one kind keeps at most half the
spool, and shares that half with the other kinds (issue 26: failing loads in a loop while the
broker was away dropped 15 549 messages, every telemetry message of the outage among them). The
replay of a file left by an earlier run applies the same bound as it streams.

The telemetry `seq` has its own small file next to the spool (`<stem>.seq`: the number and its
CRC-32), replaced atomically whenever a block of SEQ_RESERVE numbers is reserved (before any of them
is used) and, exactly, at a clean stop; the spool's SEQ frames are a second copy. When there is no
valid record (a first run, an emptied state directory, a record missing beside a spool, unreadable
or failing its checksum), `seq` starts above anything that could have been used: SEQ_RESERVE above
the spool's copy, and at least SEQ_PER_S per second of Unix time. A number is never used twice; a
gap is only ever numbers skipped or messages dropped.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from mcpd import events
from mcpd.telemetry import journal as frames
from mcpd.telemetry import seqfile
from mcpd.telemetry.journal import SHARES, Journal, Kind, Message, add_frame, done_frame, seq_frame

log = logging.getLogger("mcpd.telemetry")

SYNC_S = 5.0
SEQ_RESERVE = 1000
"""A crash skips at most this many `seq` values, and the journal records the reservation once per
this many telemetry messages."""
MAX_BYTES = 64 * 2**20
"""Payload bytes the spool holds at most, in memory and live on disk."""
SEQ_PER_S = 10
"""Telemetry messages a second at most (telemetry_ms >= 100): with no record, `seq` starts at this
many per second of Unix time, above any number a run could have reached since 1970."""


class Spool:
    """Owned by the publisher's thread; nothing here is thread-safe."""

    def __init__(self, capacity: int, journal: Journal | None, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.dropped = 0
        """Messages dropped for room since the daemon started."""
        self._journal = journal
        self._clock = clock
        self._queues: dict[str, OrderedDict[int, Message]] = {s: OrderedDict() for s in SHARES}
        """Per share (telemetry, each kind of event), oldest first."""
        self._bytes_of = dict.fromkeys(SHARES, 0)
        self._journaled: set[int] = set()
        self._unjournaled: dict[int, None] = {}
        self._done: list[int] = []
        self._dead = 0
        self._next_id = 1
        self._seq = self._seq_limit = 0
        self._seq_path: Path | None = None
        self._bytes = 0
        self._evicted: set[int] | None = None
        """While replaying: ids dropped for room, unless a later DONE frame says delivered."""
        self._synced_at = clock()

    @classmethod
    def open(
        cls,
        path: Path | None,
        capacity: int,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
    ) -> Spool:
        """The spool left at `path` by an earlier run (none: memory only)."""
        spool = cls(capacity, None, clock)
        if path is None:
            return spool
        spool._seq_path = path.with_name(path.stem + ".seq")
        seq_copies: list[int] = []
        spool._evicted = set()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            existed = frames.load(path, lambda kind, body: spool._replay(kind, body, seq_copies))
            spool._journal = Journal(path)
        except OSError as exc:
            log.error(
                "telemetry spool %s unusable (%s): spooling in memory only until restart",
                path,
                frames.describe(exc),
            )
            existed = True  # what was there is unknown
        spool.dropped, spool._evicted = len(spool._evicted), None
        spool._done.clear()  # the rewrite below leaves out whatever replay removed
        if spool.dropped:
            log.warning(
                "telemetry spool: %d messages of the last run dropped for room", spool.dropped
            )
        spool._resume_seq(existed, max(seq_copies, default=None), wall())
        if spool._journal is not None:
            try:
                spool._journal.rewrite(spool._live(), spool._seq_limit)
            except OSError as exc:
                spool._lose_journal(exc)
        if len(spool):
            log.info("telemetry spool: %d messages from the last run", len(spool))
        return spool

    def _replay(self, kind: int, body: bytes, seq_copies: list[int]) -> None:
        if kind == frames.ADD:
            message = frames.parse_add(body)
            self._hold(message)
            self._journaled.add(message.id)
            self._next_id = max(self._next_id, message.id + 1)
            self._evict()
        elif kind == frames.DONE:
            assert self._evicted is not None
            for ident in frames.parse_ids(body):
                self._evicted.discard(ident)
                self.remove(ident)
        elif kind == frames.SEQ:
            seq_copies.append(frames.parse_seq(body))
        else:
            raise ValueError(f"unknown frame type {kind}")

    def _resume_seq(self, spool_existed: bool, spool_seq: int | None, now: float) -> None:
        """Start above every number an earlier run may have used (see the module's docstring)."""
        assert self._seq_path is not None
        saved, doubt = seqfile.read(self._seq_path)
        if saved is not None:
            self._seq = self._seq_limit = saved
            return
        # No record: a first run looks the same as a state directory that was emptied, so both
        # start from the clock's floor rather than from 0.
        above_copy = 0 if spool_seq is None else spool_seq + SEQ_RESERVE
        self._seq = max(above_copy, int(now) * SEQ_PER_S)
        if doubt is None and not spool_existed:
            log.info("telemetry seq: no earlier record; starting at %d", self._seq)
        else:
            log.warning(
                "telemetry seq: %s; continuing at %d so that no number is used twice",
                doubt or "no sequence file beside the spool",
                self._seq,
            )
        self._reserve()

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        if self._seq > self._seq_limit:
            self._reserve()
        return seq

    def _reserve(self) -> None:
        """Record, before using them, that the numbers up to SEQ_RESERVE ahead may be used."""
        self._seq_limit = self._seq + SEQ_RESERVE
        self._append(seq_frame(self._seq_limit))
        self._dead += 1  # superseded by the next reservation or by a rewrite
        self._save_seq(self._seq_limit)

    def _save_seq(self, seq: int) -> None:
        if self._seq_path is not None:
            seqfile.save(self._seq_path, seq)

    def add(self, kind: Kind, payload: bytes, event: str = frames.OTHER) -> Message:
        """Spool a message; for an event, `event` is its kind (mcpd.events.KINDS)."""
        known = event if event in events.KINDS else frames.OTHER
        message = Message(self._next_id, kind, payload, known)
        self._next_id += 1
        self._hold(message)
        self._unjournaled[message.id] = None
        self._evict()
        return message

    def _hold(self, message: Message) -> None:
        self._queues[message.share][message.id] = message
        self._bytes += len(message.payload)
        self._bytes_of[message.share] += len(message.payload)

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

    def remove(self, ident: int) -> Message | None:
        """Delivered (or dropped): forget it, on disk too. The message, if it was held."""
        for queue in self._queues.values():
            message = queue.pop(ident, None)
            if message is not None:
                self._bytes -= len(message.payload)
                self._bytes_of[message.share] -= len(message.payload)
                break
        else:
            return None
        self._unjournaled.pop(ident, None)
        if ident in self._journaled:
            self._journaled.discard(ident)
            self._done.append(ident)
        return message

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        self._evict()

    def _evict(self) -> None:
        while len(self) > self.capacity or self._bytes > MAX_BYTES:
            ident = next(iter(self._queues[self._fullest(self._bytes > MAX_BYTES)]))
            self.remove(ident)
            if self._evicted is None:
                self.dropped += 1
            else:
                self._evicted.add(ident)

    def _fullest(self, by_bytes: bool) -> str:
        """The share whose oldest message goes to make room (see the module's docstring)."""
        held = self._bytes_of if by_bytes else {s: len(q) for s, q in self._queues.items()}
        kinds = {share: n for share, n in held.items() if share != "telemetry"}
        if held["telemetry"] >= sum(kinds.values()):
            return "telemetry"
        return max(kinds, key=kinds.__getitem__)

    def persist(self, cursor: int) -> None:
        """Journal what waits (ids above `cursor`), record deliveries; fsync and compact when due."""
        if self._journal is None:
            self._unjournaled.clear()
            return
        for ident in [i for i in self._unjournaled if i > cursor]:
            del self._unjournaled[ident]
            message = self._find(ident)
            if (
                len(message.payload) > frames.MAX_BODY - 9
            ):  # with its id and kind: no frame holds it
                log.error(
                    "telemetry spool: a %s of %d bytes waits in memory only",
                    message.kind,
                    len(message.payload),
                )
                continue
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
        self._save_seq(self._seq)
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

    def _live(self) -> list[Message]:
        """The journaled messages still owed, oldest first."""
        return sorted(
            (m for q in self._queues.values() for m in q.values() if m.id in self._journaled),
            key=lambda m: m.id,
        )

    def _rewrite(self, seq: int) -> None:
        assert self._journal is not None
        self._journal.rewrite(self._live(), seq)
        self._dead = 0
        self._synced_at = self._clock()

    def _lose_journal(self, exc: OSError) -> None:
        assert self._journal is not None
        log.error(
            "telemetry spool %s: cannot write (%s); spooling in memory only until restart",
            self._journal.path,
            exc.strerror or exc,
        )
        self._journal.close()
        self._journal = None
