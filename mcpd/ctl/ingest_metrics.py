"""`mcpctl ingest`'s own counters, and the `/metrics` that shows them (--metrics-listen).

Kept as plain numbers by the one thread that writes (no lock on the hot path) and read at each
scrape by a custom collector, as the board's /metrics is made (mcpd/serving/metrics.py); the
registry is this process's own. docs/metrics.md §5 lists the families.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

PREFIX = "mcpd_ingest_"


@dataclass
class Counters:
    received: int = 0
    """Messages taken from the broker (telemetry and status)."""
    written: int = 0
    """Messages in requests the store accepted."""
    duplicates: int = 0
    invalid: int = 0
    """Not mcpd telemetry (not JSON, another schema, a device_id not its topic's)."""
    rejected: int = 0
    """Messages the store refused for good (a 4xx for the request that held only them)."""
    write_failures: int = 0
    """Requests that failed and were sent again (5xx, 429, no answer)."""
    write_rejections: int = 0
    """Requests refused with a 4xx (each then split in two and sent again, down to one message)."""
    samples: int = 0
    """Samples in accepted requests."""
    lag_s: float | None = None
    """At the last accepted request: its time minus the `ts` of the newest message in it."""
    queued: int = 0
    """Messages received and not yet acknowledged to the broker."""


class CountersCollector:
    """prometheus_client's custom collector protocol: `collect` is called at each scrape."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self.counters
        for name, help, value in (
            ("messages_received", "Messages taken from the broker.", c.received),
            ("messages_written", "Messages in requests the store accepted.", c.written),
            ("duplicates", "Messages dropped as already taken (device, seq).", c.duplicates),
            ("invalid_messages", "Messages that are not mcpd telemetry.", c.invalid),
            ("rejected_messages", "Messages the store refused for good (4xx).", c.rejected),
            ("samples_written", "Samples in requests the store accepted.", c.samples),
        ):
            yield CounterMetricFamily(PREFIX + name, help, value=value)
        errors = CounterMetricFamily(
            PREFIX + "write_errors",
            "Remote-write requests not accepted: failed (5xx, 429, no answer; sent again) or "
            "rejected (4xx; split and sent again, down to one message).",
            labels=["kind"],
        )
        errors.add_metric(["failed"], c.write_failures)
        errors.add_metric(["rejected"], c.write_rejections)
        yield errors
        lag = GaugeMetricFamily(
            PREFIX + "lag_seconds",
            "At the last accepted request: its time minus the ts of the newest message in it.",
            unit="seconds",
        )
        if c.lag_s is not None:
            lag.add_metric([], c.lag_s)
        yield lag
        yield GaugeMetricFamily(
            PREFIX + "queued_messages",
            "Messages received and not yet acknowledged to the broker.",
            value=c.queued,
        )


def serve(counters: Counters, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """`/metrics` on `host`:`port`, in a thread of its own."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CountersCollector(counters))
    return start_http_server(port, host, registry=registry)
