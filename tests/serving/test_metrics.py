"""The Prometheus exposition, read back with prometheus_client's own parsers: names, types, units,
labels, values against the status document, and the content negotiation."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from mcpd.families import BOUNDS, GOVERNOR_STATES
from mcpd.serving.metrics import Exposition
from mcpd.snapshot import LATENCY_BUCKETS_S, ModelStats
from mcpd.status import GovernorState
from tests.support.metrics import STATS, full_document
from tests.support.serving_server import status_document


def scrape(document: dict[str, Any], accept: str = "") -> tuple[dict[str, Metric], str]:
    body, content_type = Exposition(lambda: document, lambda: STATS).render(accept)
    parse = (
        openmetrics_families if "openmetrics" in content_type else text_string_to_metric_families
    )
    return {family.name: family for family in parse(body.decode())}, content_type


def samples(family: Metric) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def test_text_format_0_0_4_by_default_with_the_status_documents_values() -> None:
    document = status_document()
    families, content_type = scrape(document)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert samples(families["mcpd_temperature_celsius"]) == {(): 61.5}
    assert samples(families["mcpd_sensor_temperature_celsius"]) == {
        (("sensor", "cpu-thermal"),): 61.5
    }
    assert samples(families["mcpd_power_watts"]) == {(("estimated", "false"),): 7.25}
    domain = document["domains"]["policy0"]
    policy0 = (("domain", "policy0"), ("kind", "cpufreq"))
    for name, key in (("cap", "cap_mhz"), ("frequency", "cur_mhz"), ("target", "target_mhz"),
                      ("min", "min_mhz"), ("max", "max_mhz")):  # fmt: skip
        family = families[f"mcpd_domain_{name}_hertz"]
        assert family.type == "gauge"
        assert samples(family) == {policy0: pytest.approx(domain[key] * 1e6)}
    assert samples(families["mcpd_batch_size"]) == {(("model", "m"),): 4}
    assert samples(families["mcpd_daemon_resident_memory_bytes"]) == {(): 50 * 2**20}
    assert samples(families["mcpd_daemon_cpu_ratio"]) == {(): 0.01}
    assert samples(families["mcpd_build_info"]) == {(("version", "0.1.0"),): 1}
    assert samples(families["mcpd_board_info"]) == {
        (("model", "test board"), ("platform", "jetson-orin")): 1
    }


@pytest.mark.parametrize("state", get_args(GovernorState))
def test_every_state_the_governor_reports_is_a_series(state: str) -> None:
    """The states are the status contract's (mcpd.status.GovernorState), not a list copied into the
    metrics, which goes stale when the governor gains one."""
    document = status_document()
    document["governor"]["state"] = state
    series = samples(scrape(document)[0]["mcpd_governor_state"])
    assert series == {(("state", s),): float(s == state) for s in get_args(GovernorState)}


def test_governor_state_is_one_series_per_state() -> None:
    families, _ = scrape(status_document())
    states = samples(families["mcpd_governor_state"])
    assert states == {(("state", s),): float(s == "holding") for s in GOVERNOR_STATES}
    odd = status_document()
    odd["governor"]["state"] = "something new"  # a state a later version adds is not lost
    assert samples(scrape(odd)[0]["mcpd_governor_state"])[(("state", "something new"),)] == 1


def test_model_counters_and_gauges() -> None:
    families, _ = scrape(status_document())
    for name, want in (
        ("mcpd_inference_requests", {"m": 4, "broken": 0}),
        ("mcpd_inference_errors", {"m": 1, "broken": 0}),
        ("mcpd_inference_batches", {"m": 1}),
        ("mcpd_inference_rows", {"m": 3}),
    ):
        family = families[name]  # the parser names a counter without its _total
        assert family.type == "counter"
        assert {s.labels["model"]: s.value for s in family.samples} == want
        assert {s.name for s in family.samples} == {name + "_total"}
    assert samples(families["mcpd_model_ready"]) == {
        (("model", "m"),): 1,
        (("model", "broken"),): 0,
    }
    assert samples(families["mcpd_inference_queued_requests"])[(("model", "m"),)] == 3


def test_what_runs_each_loaded_model_is_an_info_metric() -> None:
    openvino = {"device": "CPU", "precision": "bf16", "capabilities": ["BF16", "FP32"]}
    stats = {
        "ov": ModelStats(True, detail={"backend": "openvino", **openvino}),
        "ort": ModelStats(
            True, detail={"backend": "onnxruntime", "provider": "CPUExecutionProvider"}
        ),
        "loading": ModelStats(False, detail={"state": "loading"}),
    }
    body, _ = Exposition(status_document, lambda: stats).render("")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    empty = {"provider": "", "device": "", "precision": "", "capabilities": ""}
    assert [s.labels for s in families["mcpd_model_backend_info"].samples] == [
        {**empty, "model": "ov", "backend": "openvino", **openvino, "capabilities": "BF16,FP32"},
        {**empty, "model": "ort", "backend": "onnxruntime", "provider": "CPUExecutionProvider"},
    ]


def buckets(family: Metric, model: str) -> dict[str, float]:
    return {
        s.labels["le"]: s.value
        for s in family.samples
        if s.name.endswith("_bucket") and s.labels["model"] == model
    }


def test_latency_histograms_in_seconds_with_cumulative_buckets() -> None:
    families, _ = scrape(status_document())
    request = families["mcpd_inference_request_duration_seconds"]
    assert request.type == "histogram"
    counts = buckets(request, "m")
    assert list(counts) == [*(f"{0.0001 * 2**k:.4f}".rstrip("0") for k in range(14)), "+Inf"]
    values = list(counts.values())
    assert values == sorted(values)  # cumulative
    # 1.5 ms, 2.5 ms and 50 ms: the first bucket holding each is 1.6 ms, 3.2 ms and 51.2 ms.
    assert (counts["0.0008"], counts["0.0016"], counts["0.0032"], counts["0.0256"]) == (0, 1, 2, 2)
    assert (counts["0.0512"], counts["+Inf"]) == (3, 3)
    totals = {s.name: s.value for s in request.samples if s.labels == {"model": "m"}}
    assert totals["mcpd_inference_request_duration_seconds_count"] == 3  # the failure is not
    assert totals["mcpd_inference_request_duration_seconds_sum"] == pytest.approx(0.054)
    queue = buckets(families["mcpd_inference_queue_duration_seconds"], "m")
    assert (queue["0.0001"], queue["0.0002"], queue["0.0004"], queue["+Inf"]) == (1, 2, 3, 3)
    compute = buckets(families["mcpd_inference_compute_duration_seconds"], "m")
    assert (compute["0.0008"], compute["0.0016"]) == (0, 3)  # 1.015 ms, the batch's, each
    assert not buckets(request, "broken")  # not loaded: no statistics, no series


def test_the_bounds_are_written_as_prometheus_client_writes_them() -> None:
    """mcpd.families writes `le` itself (mcpctl ingest has no prometheus_client to ask), so a
    series from telemetry and one scraped from the board are the same series."""
    assert (*map(floatToGoString, LATENCY_BUCKETS_S), "+Inf") == BOUNDS


def test_openmetrics_when_asked_for_with_units() -> None:
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    families, content_type = scrape(status_document(), accept)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    units = {name: family.unit for name, family in families.items()}
    assert units["mcpd_temperature_celsius"] == "celsius"
    assert units["mcpd_power_watts"] == "watts"
    assert units["mcpd_domain_cap_hertz"] == "hertz"
    assert units["mcpd_daemon_resident_memory_bytes"] == "bytes"
    assert units["mcpd_inference_request_duration_seconds"] == "seconds"
    assert families["mcpd_inference_requests"].type == "counter"


def test_unknown_values_are_absent_not_zero() -> None:
    document = status_document()
    document.update(temperature_c=None, power_w=None, temperatures={"cpu-thermal": None})
    document["thermal"] = {"headroom": None}
    document["domains"]["policy0"]["cur_mhz"] = None
    families, _ = scrape(document)
    for name in ("mcpd_temperature_celsius", "mcpd_power_watts", "mcpd_sensor_temperature_celsius",
                 "mcpd_domain_frequency_hertz", "mcpd_thermal_headroom_ratio"):  # fmt: skip
        assert not families[name].samples, name
    assert samples(families["mcpd_domain_cap_hertz"])  # the rest of the domain is there


def test_estimated_power_headroom_and_the_efficiency_fields() -> None:
    families, _ = scrape(full_document())
    assert samples(families["mcpd_power_watts"]) == {(("estimated", "true"),): 7.25}
    modelled = status_document() | {"power_source": "estimate"}  # the Energy Model (issue 15)
    assert samples(scrape(modelled)[0]["mcpd_power_watts"]) == {(("estimated", "true"),): 7.25}
    assert samples(families["mcpd_thermal_headroom_ratio"]) == {(): 0.8}
    assert samples(families["mcpd_thermal_time_to_throttle_seconds"]) == {(): 42}
    assert samples(families["mcpd_governor_info"]) == {
        (("policy", "adaptive"), ("profile", "quiet")): 1
    }
    assert samples(families["mcpd_governor_external_cap_changes"]) == {(): 2}
    assert samples(families["mcpd_serving_restarts"]) == {(): 3}
    assert samples(families["mcpd_inference_energy_per_inference_joules"]) == {
        (("model", "m"),): 0.125
    }


def test_the_cooling_health() -> None:
    """The thermal resistance, its baseline and drift where the status has them; the cooling's
    state one series per state; nothing but the states before any window was fitted."""
    families, _ = scrape(status_document())
    assert samples(families["mcpd_thermal_resistance_celsius_per_watt"]) == {(): 6.41}
    assert samples(families["mcpd_thermal_resistance_baseline_celsius_per_watt"]) == {(): 6.38}
    assert samples(families["mcpd_cooling_drift_ratio"]) == {(): 1.005}
    assert samples(families["mcpd_thermal_time_constant_seconds"]) == {(): 36.2}
    assert samples(families["mcpd_cooling_confidence_ratio"]) == {(): 0.97}
    states = samples(families["mcpd_cooling_state"])
    assert states[(("state", "normal"),)] == 1 and sum(states.values()) == 1
    assert {s for ((_, s),) in states} == {"off", "learning", "normal", "rising", "degraded"}
    learning = status_document()
    learning["cooling"] = {**learning["cooling"], "state": "learning", "drift_ratio": None}
    learning["cooling"]["thermal_resistance_c_per_w"] = None
    families, _ = scrape(learning)
    assert not samples(families["mcpd_cooling_drift_ratio"])
    assert not samples(families["mcpd_thermal_resistance_celsius_per_watt"])
    assert samples(families["mcpd_cooling_state"])[(("state", "learning"),)] == 1


def test_an_empty_document_still_renders() -> None:
    """Before the governor's first status (serving started first), every family is empty."""
    families, _ = scrape({})
    assert not samples(families["mcpd_governor_state"])
    assert samples(families["mcpd_model_ready"])  # serving's own part is there


def test_each_exposition_has_its_own_registry() -> None:
    one = Exposition(status_document, lambda: STATS)
    other = Exposition(dict, dict)
    assert b"mcpd_batch_size{" in one.render("")[0]
    assert b"mcpd_batch_size{" not in other.render("")[0]
