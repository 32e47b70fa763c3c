"""`GET /metrics`: the status document and the per-model counters in Prometheus text format 0.0.4."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mcpd.snapshot import ModelStats
from mcpd.status import StatusDocument

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help: str, samples: Iterable[tuple[Mapping[str, str], Any]]
    ) -> None:
        rows = [(labels, value) for labels, value in samples if value is not None]
        if not rows:
            return
        self.lines += [f"# HELP mcpd_{name} {help}", f"# TYPE mcpd_{name} {kind}"]
        for labels, value in rows:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            number = float(value) if not isinstance(value, bool) else float(int(value))
            self.lines.append(
                f"mcpd_{name}{{{text}}} {number!r}" if text else f"mcpd_{name} {number!r}"
            )


def render(status: StatusDocument | None, models: Mapping[str, ModelStats]) -> str:
    """The exposition; with no status document yet (the governor has not published its first),
    the models' families only."""
    out = _Text()
    if status is not None:
        _governor_families(out, status)
    out.family(
        "model_ready",
        "gauge",
        "1 when the model serves.",
        [({"model": m}, s.ready) for m, s in models.items()],
    )
    out.family(
        "inference_requests_total",
        "counter",
        "Inference requests answered.",
        [({"model": m}, s.requests) for m, s in models.items()],
    )
    out.family(
        "inference_errors_total",
        "counter",
        "Inference requests answered with an error.",
        [({"model": m}, s.errors) for m, s in models.items()],
    )
    out.family(
        "inference_latency_milliseconds",
        "gauge",
        "Request latency over the last requests, by quantile.",
        [
            ({"model": m, "quantile": q}, v)
            for m, s in models.items()
            for q, v in (("0.5", s.p50_ms), ("0.99", s.p99_ms))
        ],
    )
    out.family(
        "queue_depth",
        "gauge",
        "Requests waiting for a batch.",
        [({"model": m}, s.queue_depth) for m, s in models.items()],
    )
    out.family(
        "batches_total",
        "counter",
        "Batches run.",
        [({"model": m}, s.detail.get("batches")) for m, s in models.items()],
    )
    return "\n".join(out.lines) + "\n"


def _governor_families(out: _Text, status: StatusDocument) -> None:
    """What the governor knows: sensors, caps, its state, the batch sizes it sets, itself."""
    out.family(
        "temperature_celsius",
        "gauge",
        "Governing temperature.",
        [({}, status["temperature_c"])],
    )
    out.family("power_watts", "gauge", "Governing power.", [({}, status["power_w"])])
    out.family(
        "sensor_temperature_celsius",
        "gauge",
        "Each temperature sensor.",
        [({"sensor": n}, v) for n, v in status["temperatures"].items()],
    )
    out.family(
        "sensor_power_watts",
        "gauge",
        "Each power sensor.",
        [({"sensor": n}, v) for n, v in status["powers"].items()],
    )
    domains = status["domains"]
    for name, help, values in (
        ("cap_mhz", "Frequency cap in force.", {n: d["cap_mhz"] for n, d in domains.items()}),
        ("cur_mhz", "Current frequency.", {n: d["cur_mhz"] for n, d in domains.items()}),
        ("target_mhz", "Governor's target.", {n: d["target_mhz"] for n, d in domains.items()}),
    ):
        out.family(
            f"domain_{name}",
            "gauge",
            help,
            [({"domain": n, "kind": domains[n]["kind"]}, v) for n, v in values.items()],
        )
    out.family(
        "thermal_headroom",
        "gauge",
        "1.0 at the throttle threshold, 0.0 thirty degrees below it.",
        [({}, status["thermal"]["headroom"])],
    )
    out.family(
        "external_cap_changes_total",
        "counter",
        "Caps found changed by another program (mcpd followed them).",
        [({}, status["governor"]["external_cap_changes"])],
    )
    out.family(
        "governor_state",
        "gauge",
        "1 for the governor's current state.",
        [({"state": status["governor"]["state"]}, 1)],
    )
    out.family(
        "batch_size",
        "gauge",
        "Batch size set by the governor.",
        [({"model": m}, size) for m, size in status["batch"].items()],
    )
    daemon = status["daemon"]
    out.family("daemon_cpu_percent", "gauge", "Daemon CPU use.", [({}, daemon["cpu_percent"])])
    out.family("daemon_rss_megabytes", "gauge", "Daemon memory.", [({}, daemon["rss_mb"])])
