"""A telemetry message as Prometheus samples: the series of the board's own `/metrics`.

Pure: the message's bytes in, its samples out. The names, units and labels are mcpd.families',
the mapping behind the board's `/metrics`, read from the status document that a telemetry message
is (README, "Telemetry message (schema 1)"); the model counters and the request and compute
latency histograms come from the message's `inference` part. Every series gets `instance` (the
device id) and `job`, the labels a Prometheus that scrapes the board gives it, so one dashboard
reads both paths. Each sample is stamped with the message's own `ts`, not the arrival time: a
message replayed from a board's spool after an outage lands where it was measured.

What a board's `/metrics` has and a telemetry message does not: the queue latency histogram,
`mcpd_model_backend_info` and the batch and row counters, which only the serving process holds.
`up` is Prometheus' own for a scrape; here it is 1 at every telemetry message, and 0 when the
board's status goes `offline` (its Will or a clean stop).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcpd.families import governor_families, model_families, series
from mcpd.latency_doc import histograms
from mcpd.snapshot import ModelStats

SCHEMA = 1
Run = tuple[str, tuple[str, ...], tuple[tuple[str, ...], ...]]
"""Series of one name side by side: (name, label names, each one's label values); `instance`
and `job` are the writer's."""
UP: Run = ("up", (), ((),))


class NotTelemetry(ValueError):
    """A message that is not mcpd telemetry of schema 1 from the board its topic names."""


@dataclass(frozen=True)
class Message:
    device: str
    seq: int | None
    """None for a status change, which has no number."""
    ts_ms: int
    """Milliseconds since the Unix epoch, remote write's unit."""
    runs: list[Run]
    """Its series, in the same order every time for a board whose sensors, domains and models
    stay (mcpd/ctl/ingest_batch.py keeps a request template per such list): a run a name, as the
    mapping gives them, so that a message costs a tuple a name, not one a series."""
    values: list[float]
    """One per series, in the order of the runs' label sets."""


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _stats(inference: object) -> dict[str, ModelStats]:
    """The model counters a telemetry message carries, as the mapping reads them; a model
    whose counters are not numbers is left out."""
    if not isinstance(inference, Mapping):
        return {}
    return {
        str(name): ModelStats(
            ready=bool(doc.get("ready")),
            requests=doc["requests"],
            errors=doc["errors"],
            queue_depth=doc["queue_depth"],
            latency=histograms(doc.get("latency")),
        )
        for name, doc in inference.items()
        if isinstance(doc, Mapping)
        and all(_count(doc.get(key)) for key in ("requests", "errors", "queue_depth"))
    }


def telemetry(device: str, payload: bytes) -> Message:
    """The samples of one telemetry message from `device` (its topic's id)."""
    try:
        document: Any = json.loads(payload)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise NotTelemetry(f"not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise NotTelemetry("not an mcpd telemetry message of schema 1")
    if document.get("device_id") != device:
        raise NotTelemetry(f"device_id {document.get('device_id')!r} on {device}'s topic")
    seq, ts = document.get("seq"), document.get("ts")
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise NotTelemetry(f"seq {seq!r} is not a number")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise NotTelemetry(f"ts {ts!r} is not a time")
    try:
        families = [
            *governor_families(document),
            *model_families(document, _stats(document.get("inference"))),
        ]
    except (AttributeError, TypeError, ValueError) as exc:  # a document of the wrong shape
        raise NotTelemetry(f"not a status document ({exc})") from None
    runs, numbers = [UP], [1.0]
    for family in families:
        for name, labels, label_sets, values in series(family):
            runs.append((name, labels, label_sets))
            numbers += values
    return Message(device, seq, round(ts * 1000), runs, numbers)


def status(device: str, payload: bytes, now: float) -> Message | None:
    """`up` 0 when a board's status says `offline`, at `now` (a status carries no time)."""
    if payload != b"offline":
        return None  # `online` is followed by telemetry, which says up
    return Message(device, None, round(now * 1000), [UP], [0.0])
