"""The metric families mcpd exports from a status document: names, units, labels and values.

One mapping for both ways they reach a store: the board's `GET /metrics` (mcpd/serving/metrics.py
renders these with prometheus_client, the latency histograms from the serving process's live
ones) and `mcpctl ingest` (mcpd/ctl/ingest_samples.py), which writes them from each telemetry
message through Prometheus remote write (the histograms from the document's `latency`). So a
dashboard reads the same series on both paths. Names, units and types follow Prometheus'
conventions; docs/metrics.md lists every family and why it is named so.

Pure: a document in, families out. The document is read key by key with a default rather than
through mcpd.status's TypedDicts: a key the sender does not send (an older board's telemetry, a
serving process before the governor's first status) is a family without samples, never a failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, get_args

from mcpd.snapshot import LATENCY_BUCKETS_S, ModelStats
from mcpd.status import CoolingState, GovernorState

PREFIX = "mcpd_"
GOVERNOR_STATES: tuple[str, ...] = get_args(GovernorState)
"""Every state the governor reports: each is a series of mcpd_governor_state, 1 for the one in
force, so a state that is not in force reads 0, not absent."""
COOLING_STATES: tuple[str, ...] = get_args(CoolingState)
COOLING_GAUGES = (
    (
        "thermal_resistance_celsius_per_watt",
        "thermal_resistance_c_per_w",
        "celsius_per_watt",
        "Thermal resistance from the governing sensor to the air, fitted to the board's own "
        "readings.",
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
    ("thermal_time_constant_seconds", "time_constant_s", "seconds", "The board's time constant."),
    ("cooling_confidence_ratio", "confidence", "ratio", "How well the last fits agree, 0 to 1."),
)
"""(name, the status's `cooling` key, unit, help) of each cooling gauge (README, "Cooling
health")."""
HERTZ_PER_MHZ = 1e6
BACKEND_LABELS = ("backend", "provider", "device", "precision", "capabilities")
"""mcpd_model_backend_info's labels besides `model`, from the loaded backend's detail; empty
where the backend has no such thing (a provider is onnxruntime's, a device OpenVINO's)."""

LATENCIES = (
    ("request", "time from arrival to answer."),
    ("queue", "time in the model's queue, until their batch was taken."),
    ("compute", "batch's compute time: joining inputs, running the model, splitting outputs."),
)
"""The latency histograms by phase (mcpd.serving.statistics records them); a model's
ModelStats.latency has those its sender has."""
BOUNDS = (*map(repr, LATENCY_BUCKETS_S), "+Inf")
"""Each bucket's `le` label, as Prometheus writes floats (Go's shortest form, which repr is for
these: prometheus_client's floatToGoString gives the same, tests/serving/test_metrics.py)."""

Kind = Literal["gauge", "counter", "info", "histogram"]
LabelSet = tuple[str, ...]
"""A sample's label values: in the family's label order, then its keys."""


class Family(NamedTuple):
    """A tuple rather than a dataclass: `mcpctl ingest` makes 33 for every telemetry message,
    and a frozen dataclass took 4 times as long to build. Its samples are two tuples side by side
    (each one's label values, each one's value) rather than one of pairs, so that the ingest
    takes a family's series whole instead of pair by pair (mcpd/ctl/ingest_samples.py)."""

    name: str
    """The family's name; a counter's series add `_total`, an info's `_info` (series_name)."""
    kind: Kind
    help: str
    unit: str
    labels: tuple[str, ...]
    label_sets: tuple[LabelSet, ...]
    values: tuple[float, ...]
    """One per label set."""
    keys: tuple[str, ...] = ()
    """An info family's labels that carry its information, a histogram's `le` (each label set's
    values after `labels`)."""
    sums: tuple[tuple[LabelSet, float], ...] = ()
    """A histogram's sum of observations per series (its samples are the cumulative buckets)."""

    def samples(self) -> Iterator[tuple[LabelSet, float]]:
        return zip(self.label_sets, self.values, strict=True)


_SUFFIX = {"gauge": "", "counter": "_total", "info": "_info", "histogram": "_bucket"}


def series_name(family: Family) -> str:
    """The name its rows' samples carry, as the exposition writes it."""
    return family.name + _SUFFIX[family.kind]


def series(
    family: Family,
) -> Iterator[tuple[str, tuple[str, ...], tuple[LabelSet, ...], tuple[float, ...]]]:
    """Its samples as a store holds them: (series name, label names, label sets, values); a
    histogram's are its buckets, then `_sum` and `_count` (the +Inf bucket), as the exposition
    writes them."""
    yield series_name(family), family.labels + family.keys, family.label_sets, family.values
    if family.kind == "histogram":
        yield family.name + "_sum", family.labels, *_numbered(family.sums)
        top = BOUNDS[-1]
        counts = [(values[:-1], n) for values, n in family.samples() if values[-1] == top]
        yield family.name + "_count", family.labels, *_numbered(counts)


def _numbered(
    rows: Iterable[tuple[Sequence[str], Any]],
) -> tuple[tuple[LabelSet, ...], tuple[float, ...]]:
    """The rows that have a number, as their label sets and values side by side: a null in the
    status is no sample. A loop: a third of the time of one comprehension split in two, at 33
    families a telemetry message."""
    label_sets, values = [], []
    for labels, value in rows:
        if isinstance(value, (int, float)):
            label_sets.append(tuple(labels))
            values.append(float(value))
    return tuple(label_sets), tuple(values)


def _gauge(
    name: str, help: str, unit: str, labels: list[str], rows: list[tuple[list[str], Any]]
) -> Family:
    return Family(PREFIX + name, "gauge", help, unit, tuple(labels), *_numbered(rows))


def _counter(name: str, help: str, labels: list[str], rows: list[tuple[list[str], Any]]) -> Family:
    return Family(PREFIX + name, "counter", help, "", tuple(labels), *_numbered(rows))


def _info(
    name: str, help: str, labels: list[str], keys: tuple[str, ...], rows: list[list[str]]
) -> Family:
    label_sets = tuple(map(tuple, rows))
    return Family(
        PREFIX + name, "info", help, "", tuple(labels), label_sets, (1.0,) * len(rows), keys
    )


def _states(name: str, whose: str, known: tuple[str, ...], state: object) -> Family:
    """One series per state, 1 for the one in force: a state not in force reads 0, not absent."""
    states = () if state is None else (*known, *{str(state)} - set(known))
    return _gauge(
        name,
        f"1 for the {whose} state in force, 0 for the others.",
        "",
        ["state"],
        [([s], int(s == state)) for s in states],
    )


def _label(value: object) -> str:
    """A label value: a list (capabilities) comma-separated, nothing as the empty string."""
    if value is None:
        return ""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _hertz(mhz: object) -> int | None:
    """Whole hertz: every frequency the kernel reports is whole kHz or Hz."""
    return round(mhz * HERTZ_PER_MHZ) if isinstance(mhz, int | float) else None


def governor_families(document: Mapping[str, Any]) -> Iterator[Family]:
    """What the governor knows: sensors, caps, its state, the batch sizes it sets."""
    power = document.get("power_w")
    estimated = document.get("power_estimated") or document.get("power_source") == "estimate"
    if "platform" in document:
        yield _info(
            "board",
            "The board: mcpd's platform and its model.",
            [],
            ("platform", "model"),
            [[str(document["platform"]), _label(document.get("model"))]],
        )
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
    cooling = document.get("cooling", {})
    for name, key, unit, help in COOLING_GAUGES:
        yield _gauge(name, help, unit, [], [([], cooling.get(key))])
    yield _states("cooling_state", "cooling's", COOLING_STATES, cooling.get("state"))
    governor = document.get("governor", {})
    yield _states("governor_state", "governor's", GOVERNOR_STATES, governor.get("state"))
    if "policy" in governor:
        yield _info(
            "governor",
            "The governor's policy and profile.",
            [],
            ("policy", "profile"),
            [[str(governor["policy"]), str(governor.get("profile", ""))]],
        )
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
        yield _info("build", "The mcpd version.", [], ("version",), [[str(daemon["version"])]])


def model_families(
    document: Mapping[str, Any], stats: Mapping[str, ModelStats]
) -> Iterator[Family]:
    """What is known of each model: `stats` are the serving process's live ones on the board, or
    those a telemetry message carries (fewer: no backend detail, no Triton counts, two of the
    three latency histograms)."""
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
    yield _info(
        "model_backend",
        "What runs each loaded model: its backend, onnxruntime's provider, OpenVINO's device, "
        "precision in force and the device's capabilities.",
        ["model"],
        BACKEND_LABELS,
        [
            [m, *(_label(s.detail.get(key)) for key in BACKEND_LABELS)]
            for m, s in stats.items()
            if "backend" in s.detail  # loaded
        ],
    )
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
        histograms = {m: s.latency[phase] for m, s in stats.items() if phase in s.latency}
        yield Family(
            f"{PREFIX}inference_{phase}_duration_seconds",
            "histogram",
            f"Successful requests' {help}",
            "seconds",
            ("model",),
            tuple((m, le) for m in histograms for le in BOUNDS),
            tuple(float(n) for h in histograms.values() for n in h.buckets),
            ("le",),
            tuple(((m,), h.sum_s) for m, h in histograms.items()),
        )
