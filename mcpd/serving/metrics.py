"""`GET /metrics`: the status document and each model's statistics for Prometheus.

A custom collector (prometheus_client's way to export values kept elsewhere) turns, at each scrape,
one status document and the models' statistics into metric families: nothing is counted twice, and
nothing is kept for Prometheus between scrapes. Each service has a registry of its own, never the
library's global one. Names, units and types follow Prometheus' conventions; docs/metrics.md lists
every family and why it is named so.

The document is read key by key with a default rather than through mcpd.status's TypedDicts: a
key the governor does not send (yet: issue 15's `thermal.seconds_to_throttle`, `power_source`,
`inference.*.joules_per_inference`) is a family without samples, never a failed scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, get_args

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from mcpd.snapshot import LATENCY_BUCKETS_S, Histogram, ModelStats
from mcpd.status import CoolingState, GovernorState

PREFIX = "mcpd_"
GOVERNOR_STATES: tuple[str, ...] = get_args(GovernorState)
"""Every state the governor reports: each is a series of mcpd_governor_state, 1 for the one in
force, so a state that is not in force reads 0, not absent."""
COOLING_STATES: tuple[str, ...] = get_args(CoolingState)
HERTZ_PER_MHZ = 1e6
LATENCIES = (
    ("request", "time from arrival to answer."),
    ("queue", "time in the model's queue, until their batch was taken."),
    ("compute", "batch's compute time: joining inputs, running the model, splitting outputs."),
)
"""The latency histograms, from the statistics recorder (mcpd.serving.statistics): buckets of
100 µs doubling to 819.2 ms, then +Inf."""
BOUNDS = [*map(floatToGoString, LATENCY_BUCKETS_S), "+Inf"]
"""Each bucket's `le` label, written as Prometheus writes floats."""

BACKEND_LABELS = ("backend", "provider", "device", "precision", "capabilities")
"""mcpd_model_backend_info's labels besides `model`, from the loaded backend's detail; empty
where the backend has no such thing (a provider is onnxruntime's, a device OpenVINO's)."""

Rows = list[tuple[list[str], Any]]


def _filled(family: GaugeMetricFamily | CounterMetricFamily, rows: Rows) -> Metric:
    """`family` with a sample per row that has a number (a null in the status is no sample)."""
    for values, value in rows:
        if isinstance(value, (int, float)):
            family.add_metric(values, float(value))
    return family


def _gauge(name: str, help: str, unit: str, labels: list[str], rows: Rows) -> Metric:
    return _filled(GaugeMetricFamily(PREFIX + name, help, labels=labels, unit=unit), rows)


def _counter(name: str, help: str, labels: list[str], rows: Rows) -> Metric:
    return _filled(CounterMetricFamily(PREFIX + name, help, labels=labels), rows)


def _label(value: object) -> str:
    """A label value: a list (capabilities) comma-separated, nothing as the empty string."""
    if value is None:
        return ""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _hertz(mhz: object) -> int | None:
    """Whole hertz: every frequency the kernel reports is whole kHz or Hz."""
    return round(mhz * HERTZ_PER_MHZ) if isinstance(mhz, (int, float)) else None


def governor_families(document: Mapping[str, Any]) -> Iterator[Metric]:
    """What the governor knows: sensors, caps, its state, the batch sizes it sets."""
    power = document.get("power_w")
    estimated = document.get("power_estimated") or document.get("power_source") == "estimate"
    yield _gauge(
        "temperature_celsius",
        "Governing temperature (the hottest SoC/CPU sensor).",
        "celsius",
        [],
        [([], document.get("temperature_c"))],
    )
    yield _gauge(
        "sensor_temperature_celsius",
        "Each temperature sensor.",
        "celsius",
        ["sensor"],
        [([n], v) for n, v in document.get("temperatures", {}).items()],
    )
    yield _gauge(
        "power_watts",
        'Governing power: the board\'s input rail, else an estimate (estimated="true": a sum of '
        "rails or a model where the board has no meter).",
        "watts",
        ["estimated"],
        [(["true" if estimated else "false"], power)],
    )
    yield _gauge(
        "sensor_power_watts",
        "Each power sensor.",
        "watts",
        ["sensor"],
        [([n], v) for n, v in document.get("powers", {}).items()],
    )
    domains = document.get("domains", {})
    for key, name, help in (
        ("cap_mhz", "cap", "Frequency cap in force (read back from sysfs)."),
        ("cur_mhz", "frequency", "Current frequency."),
        ("target_mhz", "target", "The governor's continuous target; the cap is it snapped."),
        ("min_mhz", "min", "Lowest cap the governor sets."),
        ("max_mhz", "max", "Highest cap the governor sets."),
    ):
        yield _gauge(
            f"domain_{name}_hertz",
            help,
            "hertz",
            ["domain", "kind"],
            [([n, d.get("kind", "")], _hertz(d.get(key))) for n, d in domains.items()],
        )
    thermal = document.get("thermal", {})
    yield _gauge(
        "thermal_headroom_ratio",
        "1 at the throttle threshold, 0 thirty degrees below it (Android's headroom).",
        "ratio",
        [],
        [([], thermal.get("headroom"))],
    )
    yield _gauge(
        "thermal_time_to_throttle_seconds",
        "Forecast time until the throttle threshold; absent when not heading there.",
        "seconds",
        [],
        [([], thermal.get("seconds_to_throttle"))],
    )
    yield from cooling_families(document.get("cooling", {}))
    governor = document.get("governor", {})
    yield _states("governor_state", "governor's", GOVERNOR_STATES, governor.get("state"))
    if "policy" in governor:
        info = InfoMetricFamily(PREFIX + "governor", "The governor's policy and profile.")
        info.add_metric(
            [], {"policy": str(governor["policy"]), "profile": str(governor.get("profile", ""))}
        )
        yield info
    yield _counter(
        "governor_external_cap_changes",
        "Caps found changed by another program (mcpd followed them).",
        [],
        [([], governor.get("external_cap_changes"))],
    )
    yield _gauge(
        "batch_size",
        "Batch size the governor sets per model.",
        "",
        ["model"],
        [([m], size) for m, size in document.get("batch", {}).items()],
    )
    serving = document.get("serving", {})
    yield _counter(
        "serving_restarts", "Restarts of the serving process.", [], [([], serving.get("restarts"))]
    )
    daemon = document.get("daemon", {})
    cpu = daemon.get("cpu_percent")
    rss = daemon.get("rss_mb")
    yield _gauge(
        "daemon_cpu_ratio",
        "The governor process's CPU use, in cores.",
        "ratio",
        [],
        [([], None if cpu is None else cpu / 100)],
    )
    yield _gauge(
        "daemon_resident_memory_bytes",
        "The governor process's resident memory.",
        "bytes",
        [],
        [([], None if rss is None else round(rss * 2**20))],
    )
    if "version" in daemon:
        build = InfoMetricFamily(PREFIX + "build", "The mcpd version.")
        build.add_metric([], {"version": str(daemon["version"])})
        yield build


def _states(name: str, whose: str, known: tuple[str, ...], state: object) -> Metric:
    """One series per state, 1 for the one in force: a state not in force reads 0, not absent."""
    states = () if state is None else (*known, *{str(state)} - set(known))
    return _gauge(
        name,
        f"1 for the {whose} state in force, 0 for the others.",
        "",
        ["state"],
        [([s], int(s == state)) for s in states],
    )


def cooling_families(cooling: Mapping[str, Any]) -> Iterator[Metric]:
    """The cooling's health (README, "Cooling health")."""
    for name, key, unit, help in (
        (
            "thermal_resistance_celsius_per_watt",
            "thermal_resistance_c_per_w",
            "celsius_per_watt",
            "Thermal resistance from the governing sensor to the air, fitted to the board's "
            "own readings.",
        ),
        (
            "thermal_resistance_baseline_celsius_per_watt",
            "baseline_c_per_w",
            "celsius_per_watt",
            "The board's thermal resistance as first learned (its baseline).",
        ),
        (
            "cooling_drift_ratio",
            "drift_ratio",
            "ratio",
            "Thermal resistance over its baseline: 1.25 is 25 % worse cooling.",
        ),
        (
            "thermal_time_constant_seconds",
            "time_constant_s",
            "seconds",
            "The board's time constant.",
        ),
        (
            "cooling_confidence_ratio",
            "confidence",
            "ratio",
            "How well the last fits agree, 0 to 1.",
        ),
    ):
        yield _gauge(name, help, unit, [], [([], cooling.get(key))])
    yield _states("cooling_state", "cooling's", COOLING_STATES, cooling.get("state"))


def model_families(
    document: Mapping[str, Any], stats: Mapping[str, ModelStats]
) -> Iterator[Metric]:
    """What the serving process knows of each model."""
    inference = document.get("inference", {})
    yield _gauge(
        "model_ready",
        "1 when the model serves.",
        "",
        ["model"],
        [([m], int(s.ready)) for m, s in stats.items()],
    )
    yield _counter(
        "inference_requests",
        "Inference requests answered, errors included.",
        ["model"],
        [([m], s.requests) for m, s in stats.items()],
    )
    yield _counter(
        "inference_errors",
        "Inference requests answered with an error.",
        ["model"],
        [([m], s.errors) for m, s in stats.items()],
    )
    runtime = InfoMetricFamily(
        PREFIX + "model_backend",
        "What runs each loaded model: its backend, onnxruntime's provider, OpenVINO's device, "
        "precision in force and the device's capabilities.",
        labels=["model"],
    )
    for m, s in stats.items():
        if "backend" in s.detail:  # loaded
            runtime.add_metric([m], {key: _label(s.detail.get(key)) for key in BACKEND_LABELS})
    yield runtime
    counted = {m: s.statistics for m, s in stats.items() if s.statistics is not None}
    yield _counter(
        "inference_batches",
        "Batches run (Triton's execution_count).",
        ["model"],
        [([m], c.execution_count) for m, c in counted.items()],
    )
    yield _counter(
        "inference_rows",
        "Batch rows run: a request of 8 rows counts 8 (Triton's inference_count).",
        ["model"],
        [([m], c.inference_count) for m, c in counted.items()],
    )
    yield _gauge(
        "inference_queued_requests",
        "Requests waiting for a batch.",
        "",
        ["model"],
        [([m], s.queue_depth) for m, s in stats.items()],
    )
    yield _gauge(
        "inference_energy_per_inference_joules",
        "Board energy attributed to one inference of the model.",
        "joules",
        ["model"],
        [([m], fields.get("joules_per_inference")) for m, fields in inference.items()],
    )
    for phase, help in LATENCIES:
        family = HistogramMetricFamily(
            f"{PREFIX}inference_{phase}_duration_seconds",
            f"Successful requests' {help}",
            labels=["model"],
            unit="seconds",
        )
        for model, counts in counted.items():
            histogram: Histogram = getattr(counts, f"{phase}_latency")
            family.add_metric(
                [model], list(zip(BOUNDS, histogram.buckets, strict=True)), histogram.sum_s
            )
        yield family


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
        yield from governor_families(document)
        yield from model_families(document, self.stats())


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
