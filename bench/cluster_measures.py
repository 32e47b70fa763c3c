"""What bench/mqtt_cluster.py makes of what it recorded. Pure: records in, figures out.

- `Heard`: one telemetry message as the consumer on a node that stays received it.
- Sequence: per board, the numbers never received (gaps) and those received more than once.
- Silence: per board, the longest time between two consecutive arrivals: how long the fleet did
  not hear from it, reconnection and the consumer's own stalls included.
- Visibility: per board, the newest sample time the store answered at each poll; a message is
  queryable at the first poll whose newest time reaches its `ts` (one ingest process writes each
  series in time order, so the newest time reaching it means the message is there).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

STORE_MS = 0.0005
"""A store keeps milliseconds: a sample at ts rounded to the millisecond is the message's."""


@dataclass(frozen=True)
class Heard:
    device: str
    seq: int
    ts: float
    """The message's own time (Unix seconds), when the board made it."""
    at: float
    """When the consumer received it (Unix seconds)."""


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank q-th percentile (0-100), None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def by_device(heard: Iterable[Heard]) -> dict[str, list[Heard]]:
    """Each board's messages in the order they arrived."""
    boards: dict[str, list[Heard]] = {}
    for message in sorted(heard, key=lambda h: h.at):
        boards.setdefault(message.device, []).append(message)
    return boards


def holes(boards: dict[str, list[Heard]]) -> list[tuple[Heard, int]]:
    """Each number between a board's first and its last that never arrived, with the message
    that arrived just before it (its `ts` tells when the missing one was made, a period later)."""
    found = []
    for messages in boards.values():
        by_seq: dict[int, Heard] = {}
        for m in messages:
            by_seq.setdefault(m.seq, m)
        for a, b in itertools.pairwise(sorted(by_seq)):
            found += [(by_seq[a], n) for n in range(a + 1, b)]
    return found


def gaps(boards: dict[str, list[Heard]]) -> dict[str, int]:
    """Per board, how many of its numbers never arrived (`holes`)."""
    found = dict.fromkeys(boards, 0)
    for before, _ in holes(boards):
        found[before.device] += 1
    return found


def twice(boards: dict[str, list[Heard]]) -> dict[str, int]:
    """Per board, the arrivals of a number that had arrived before."""
    return {d: len(ms) - len({m.seq for m in ms}) for d, ms in boards.items()}


def silences(boards: dict[str, list[Heard]], start: float, end: float) -> dict[str, float]:
    """Per board, the longest time between consecutive arrivals within [start, end]."""
    found = {}
    for device, messages in boards.items():
        times = [m.at for m in messages if start <= m.at <= end]
        found[device] = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    return found


@dataclass
class Visibility:
    """Per board, (poll time, newest sample time) each time the store's newest time grew."""

    polls: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    def record(self, at: float, newest: dict[str, float]) -> None:
        """One poll's answer, received at `at`: the newest sample time of each board."""
        for device, ts in newest.items():
            times, newests = self.polls.setdefault(device, ([], []))
            if not newests or ts > newests[-1]:
                times.append(at)
                newests.append(ts)

    def queryable_at(self, device: str, ts: float) -> float | None:
        """When the sample of a message made at `ts` was first seen by a query; None if never."""
        times, newests = self.polls.get(device, ([], []))
        i = bisect.bisect_left(newests, ts - STORE_MS)
        return times[i] if i < len(times) else None


def latencies(
    heard: Iterable[Heard], visibility: Visibility, start: float, end: float
) -> tuple[list[float], int]:
    """Query-visible time minus `ts` of every message made within [start, end), and how many of
    them no poll ever saw."""
    found, unseen = [], 0
    for message in heard:
        if start <= message.ts < end:
            seen = visibility.queryable_at(message.device, message.ts)
            if seen is None:
                unseen += 1
            else:
                found.append(seen - message.ts)
    return found, unseen


def store_check(
    boards: dict[str, list[Heard]], stored: dict[str, list[int]]
) -> tuple[list[Heard], int]:
    """(missing, twice) of the store against the consumer: the messages that arrived whose sample
    the store lacks, and how many samples it holds more than once (the same millisecond again).
    `stored`: each board's sample times in ms, as the store returned them."""
    missing: list[Heard] = []
    doubled = 0
    for device, messages in boards.items():
        times = stored.get(device, [])
        held = set(times)
        missing += [
            m for m in {m.seq: m for m in messages}.values() if round(m.ts * 1000) not in held
        ]
        doubled += len(times) - len(held)
    return missing, doubled
