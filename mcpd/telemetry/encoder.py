"""Telemetry and event messages as compact JSON (the schema is in the README; keep it stable).

A telemetry message is the daemon's status document plus what only the publisher knows: the
message's `seq`, the request rate since the previous message, and the spool's fill and losses;
less the placement plan, which changes only with the configuration and would add a third to every
message a fleet carries (it is in the status and `mcpctl status`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from mcpd.events import Event
from mcpd.status import StatusDocument

SCHEMA = 1
"""Bumped only for a change that breaks a reader; new keys do not bump it."""
NOT_SENT = ("placement",)
"""Status keys that stay on the board."""


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def dumps(document: Mapping[str, Any]) -> bytes:
    """JSON that every parser accepts: NaN and infinities (no JSON for them) become null."""
    try:
        text = json.dumps(document, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:
        text = json.dumps(_finite(document), separators=(",", ":"), default=str)
    return text.encode()


def telemetry(
    status: StatusDocument,
    *,
    device: str,
    seq: int,
    requests_per_s: float | None,
    queued: int,
    dropped: int,
) -> bytes:
    head = {"schema": SCHEMA, "device_id": device, "seq": seq, "ts": status["ts"]}
    tail = {"requests_per_s": requests_per_s, "spool": {"queued": queued, "dropped": dropped}}
    sent = {key: value for key, value in status.items() if key not in NOT_SENT}
    return dumps({**head, **sent, **tail})


def event(event: Event, *, device: str) -> bytes:
    return dumps(
        {
            "schema": SCHEMA,
            "device_id": device,
            "ts": round(event.ts, 3),
            "kind": event.kind,
            "message": event.message,
            "data": event.data,
        }
    )


class RequestRate:
    """Requests per second over all models since the previous status document."""

    def __init__(self) -> None:
        self._last: tuple[float, int] | None = None

    def __call__(self, status: StatusDocument) -> float | None:
        ts = status["ts"]
        total = sum(stats["requests"] for stats in status["inference"].values())
        last, self._last = self._last, (ts, total)
        if last is None or ts <= last[0] or total < last[1]:
            return None  # first sample, a clock step back, or counters reset by a restart
        return round((total - last[1]) / (ts - last[0]), 3)
