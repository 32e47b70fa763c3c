"""`GET /metrics`: the status document and each model's statistics for Prometheus.

A custom collector (prometheus_client's way to export values kept elsewhere) turns, at each scrape,
one status document and the models' statistics into metric families: nothing is counted twice, and
nothing is kept for Prometheus between scrapes. Each service has a registry of its own, never the
library's global one. The families themselves, their names, units and values, are mcpd.families'
(the same for `mcpctl ingest`), the latency histograms from this process's live ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from mcpd.families import Family, governor_families, model_families
from mcpd.snapshot import ModelStats


def exposed(family: Family) -> Metric:
    """A family as prometheus_client's custom collectors yield it."""
    metric: GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily | HistogramMetricFamily
    if family.kind == "histogram":
        metric = HistogramMetricFamily(
            family.name, family.help, labels=list(family.labels), unit=family.unit
        )
        buckets: dict[tuple[str, ...], list[tuple[str, float]]] = {}
        for values, count in family.samples():
            buckets.setdefault(values[:-1], []).append((values[-1], count))
        for values, total in family.sums:
            metric.add_metric(list(values), buckets[values], total)
        return metric
    if family.kind == "info":
        metric = InfoMetricFamily(family.name, family.help, labels=list(family.labels))
        split = len(family.labels)
        for values in family.label_sets:
            metric.add_metric(
                list(values[:split]), dict(zip(family.keys, values[split:], strict=True))
            )
        return metric
    if family.kind == "counter":
        metric = CounterMetricFamily(family.name, family.help, labels=list(family.labels))
    else:
        metric = GaugeMetricFamily(
            family.name, family.help, labels=list(family.labels), unit=family.unit
        )
    for values, value in family.samples():
        metric.add_metric(list(values), value)
    return metric


class StatusCollector:
    """prometheus_client's custom collector protocol: `collect` is called at each scrape."""

    def __init__(
        self,
        status: Callable[[], Mapping[str, Any] | None],
        stats: Callable[[], Mapping[str, ModelStats]],
    ) -> None:
        self.status = status
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        document = self.status() or {}  # none before the governor's first: serving's part only
        stats = self.stats()
        yield from map(exposed, governor_families(document))
        yield from map(exposed, model_families(document, stats))


class Exposition:
    """One registry per service, holding its collector."""

    def __init__(
        self,
        status: Callable[[], Mapping[str, Any] | None],
        stats: Callable[[], Mapping[str, ModelStats]],
    ) -> None:
        # auto_describe off: registering must not scrape (the status may not be there yet).
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(status, stats))

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition and its content type, chosen from the request's Accept header: text
        format 0.0.4 by default, OpenMetrics 1.0 when the scraper asks for it (Prometheus does)."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
