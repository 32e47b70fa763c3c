"""What the exposition tests scrape: a real recorder's statistics, the status document with every
optional field, and the series a full scrape exports."""

from __future__ import annotations

import copy
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mcpd.serving.metrics import Exposition
from mcpd.serving.statistics import Recorder, Timing
from mcpd.snapshot import ModelStats, Statistics
from tests.support.serving_server import status_document


def recorded() -> Statistics:
    """A real recorder's snapshot: one batch of 3 rows, three requests answered, one failed."""
    recorder = Recorder(wall=lambda: 1.7e9)
    recorder.executed(3, input_ns=10_000, infer_ns=1_000_000, output_ns=5_000)
    for request_ns, queue_ns in ((1_500_000, 300_000), (2_500_000, 150_000), (50_000_000, 0)):
        recorder.succeeded(request_ns, Timing(queue_ns, 10_000, 1_000_000, 5_000))
    recorder.failed(400_000)
    return recorder.snapshot()


RECORDED = recorded()
STATS = {
    "m": ModelStats(
        True, requests=4, errors=1, queue_depth=3, statistics=RECORDED, latency=RECORDED.latency
    ),
    "broken": ModelStats(False),
}


def full_document() -> dict[str, Any]:
    """The test document with every optional field the exposition reads."""
    document = copy.deepcopy(status_document())
    document["power_estimated"] = True
    document["thermal"] = {"headroom": 0.8, "seconds_to_throttle": 42}
    document["governor"].update(policy="adaptive", profile="quiet", external_cap_changes=2)
    document["serving"] = {"restarts": 3}
    document["inference"] = {"m": {"joules_per_inference": 0.125}}
    return document


def exported() -> dict[str, set[str]]:
    """Every series name in a full scrape, with its label names."""
    body, _ = Exposition(full_document, lambda: STATS).render("")
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series
