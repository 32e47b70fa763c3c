"""A model's latency histograms as the status document carries them (ModelDoc.latency), and so
telemetry, and the stats message from the serving process to the governor (mcpd.ipc): the two
the fleet dashboard's quantiles read (examples/grafana-fleet.json), so that they reach a store
through `mcpctl ingest` as they do through a scrape of the board's /metrics.

Written as Prometheus counts a histogram, so that a reader has nothing to add up: the cumulative
count at each bound of mcpd.snapshot.LATENCY_BUCKETS_S, then the count (the +Inf bucket) and the
sum. Read back tolerantly: telemetry comes from boards of any version.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from mcpd.snapshot import LATENCY_BUCKETS_S, Histogram


class HistogramDoc(TypedDict):
    """A latency histogram as Prometheus counts one: the successful requests <= each bound of
    mcpd.snapshot.LATENCY_BUCKETS_S (100 µs doubling to 819.2 ms), cumulative; then all of them
    (the +Inf bucket) and their total time."""

    buckets: list[int]
    count: int
    sum_s: float


class LatencyDoc(TypedDict):
    """The histograms behind the fleet dashboard's latency quantiles (examples/grafana-fleet.json),
    so that they reach a store through telemetry too (`mcpctl ingest`); the queue histogram
    stays on the board's /metrics."""

    request: HistogramDoc
    """Arrival to answer."""
    compute: HistogramDoc
    """The request's batch's compute: joining inputs, running the model, splitting outputs."""


LATENCY_PHASES: tuple[str, ...] = tuple(LatencyDoc.__annotations__)


def latency_doc(histograms: Mapping[str, Histogram]) -> LatencyDoc | None:
    """A model's `latency` from its histograms by phase; None unless it has both."""
    if not all(phase in histograms for phase in LATENCY_PHASES):
        return None

    def doc(histogram: Histogram) -> HistogramDoc:
        *bounded, count = histogram.buckets
        return {"buckets": bounded, "count": count, "sum_s": round(histogram.sum_s, 6)}

    return {"request": doc(histograms["request"]), "compute": doc(histograms["compute"])}


def histograms(latency: object) -> dict[str, Histogram]:
    """The histograms of a model's `latency` as the governor gets it from serving and a reader
    from telemetry (of any mcpd version): each phase that is whole, one count per bound, then
    the count and the sum; one that is not (an older board's, a broken sender's) is left out."""
    found: dict[str, Histogram] = {}
    if not isinstance(latency, Mapping):
        return found
    for phase in LATENCY_PHASES:
        doc = latency.get(phase)
        if not isinstance(doc, Mapping):
            continue
        buckets, count, total = doc.get("buckets"), doc.get("count"), doc.get("sum_s")
        counts = [*buckets, count] if isinstance(buckets, list) else []
        if (
            len(counts) == len(LATENCY_BUCKETS_S) + 1
            and all(isinstance(c, int) and not isinstance(c, bool) for c in counts)
            and isinstance(total, int | float)
            and not isinstance(total, bool)
        ):
            found[phase] = Histogram(tuple(counts), float(total))
    return found
