"""Where a message of bench/mqtt_cluster.py went missing: each stage's set of (device, seq),
compared with the one before it. Pure: what each stage recorded in, figures out.

- acked: the boards' publisher got a PUBACK for it (the broker took it).
- heard: the recording consumer on node 0 received it.
- delivered: the ingest's paho client received it (`mcpctl ingest --log-level debug`: a line
  per delivery, with its topic and packet id; the seq is the writer's, so deliveries are counted
  per board and matched against what the writer took).
- written: in a request the store accepted (the writer's `written:` lines: device, seq, ts).
- stored: its sample in VictoriaMetrics, by its time (ms), from /api/v1/export (the store's own
  data) and from the bench's range query (what a dashboard would see).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, int]
"""(device, seq)."""

DELIVERY = re.compile(r"DEBUG mcpctl\.ingest: [^/]+/([^/]+)/telemetry: mid (\d+)( dup)?,")
WRITTEN = "DEBUG mcpctl.ingest: written: "
TAKEN_BEFORE = re.compile(r"DEBUG mcpctl\.ingest: (\S+) seq (\d+): taken before")


@dataclass
class IngestLog:
    deliveries: Counter[str] = field(default_factory=Counter)
    """Per board, telemetry deliveries to the paho client (duplicates included)."""
    dup_flagged: int = 0
    """Deliveries the broker flagged DUP (it sent them before)."""
    written: dict[Key, int] = field(default_factory=dict)
    """(device, seq) -> ts (ms) of each message in an accepted request."""
    writes: Counter[Key] = field(default_factory=Counter)
    taken_before: Counter[Key] = field(default_factory=Counter)


def ingest_log(lines: Iterable[str]) -> IngestLog:
    found = IngestLog()
    for line in lines:
        if (delivery := DELIVERY.match(line)) is not None:
            found.deliveries[delivery[1]] += 1
            found.dup_flagged += delivery[3] is not None
        elif line.startswith(WRITTEN):
            for item in line[len(WRITTEN) :].split():
                device, seq, ts = item.split(":")
                if seq != "None":  # a status change
                    found.written[device, int(seq)] = int(ts)
                    found.writes[device, int(seq)] += 1
        elif (before := TAKEN_BEFORE.match(line)) is not None:
            found.taken_before[before[1], int(before[2])] += 1
    return found


def stages(
    acked: dict[str, list[int]],
    heard: dict[Key, float],
    log: IngestLog,
    stored: dict[str, dict[str, list[int]]],
    killed_at: float,
) -> dict[str, Any]:
    """`heard`: (device, seq) -> ts of what the consumer received; `stored`: per way of reading
    the store ("export", "query", each at a time of reading), each board's sample times (ms)."""
    made = dict(heard)
    ts_of = {key: ms / 1000 for key, ms in log.written.items()}
    acked_keys = {(d, s) for d, seqs in acked.items() for s in seqs}
    for key in acked_keys - made.keys():
        if key in ts_of:
            made[key] = ts_of[key]
    written = set(log.written)
    per_board_written = Counter(d for d, _ in log.writes.elements())
    per_board_before = Counter(d for d, _ in log.taken_before.elements())
    # Each delivery either was written or was dropped as taken before: a board whose deliveries
    # are all accounted for lost nothing between the paho client and the store's answer.
    unaccounted = {
        d: n - per_board_written[d] - per_board_before[d]
        for d, n in log.deliveries.items()
        if n != per_board_written[d] + per_board_before[d]
    }

    def when(keys: Iterable[Key]) -> list[tuple[str, int, float | None]]:
        return sorted(
            (d, s, None if (d, s) not in made else round(made[d, s] - killed_at, 1))
            for d, s in keys
        )

    figures: dict[str, Any] = {
        "acked": len(acked_keys),
        "heard": len(heard),
        "delivered_to_ingest": sum(log.deliveries.values()),
        "delivered_dup_flag": log.dup_flagged,
        "written": len(written),
        "written_twice": sum(n - 1 for n in log.writes.values()),
        "taken_before": sum(log.taken_before.values()),
        "deliveries_unaccounted": unaccounted,
        "acked_not_heard": when(acked_keys - heard.keys()),
        "acked_not_written": when(acked_keys - written),
        "heard_not_written": when(heard.keys() - written),
        "written_not_acked": len(written - acked_keys),
    }
    lacking = {}
    for way, boards in stored.items():
        held = {(d, ms) for d, times in boards.items() for ms in times}
        lacking[way] = {key for key, ms in log.written.items() if (key[0], ms) not in held}
        figures[f"written_not_stored_{way}"] = when(lacking[way])
    if {"export", "export_settled"} <= lacking.keys():
        # Not in the store when the bench first looked, in it after --settle: written late, as
        # the broker's redelivery reached the ingest. Not lost.
        figures["stored_late"] = when(lacking["export"] - lacking["export_settled"])
    return figures
