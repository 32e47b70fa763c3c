"""The status document's typed contract (mcpd.status): what the daemon builds has exactly its keys
and types (checked by mcpd.shapes, as the IPC messages are), and every path the document takes
keeps that shape."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from mcpd import status
from mcpd.governor.timing import LoopTiming
from mcpd.ipc import STATUS_BYTES, SharedBlock
from mcpd.serving import metrics
from mcpd.shapes import mismatches
from mcpd.snapshot import CoolingStatus, DomainStatus, ModelStats, WriteFailure
from tests.support.mqtt_status import FakeBoard, placement
from tests.support.serving_server import Served, config, status_document
from tests.support.snapshots import snapshot


def test_the_document_has_exactly_the_contracts_keys_and_types() -> None:
    document = FakeBoard()()
    document["daemon"] = status.DaemonStats("normal")()
    timing = LoopTiming()
    timing.lateness_s.append(0.001)
    document["loop"] = timing.summary()
    assert mismatches(document, status.StatusDocument) == []
    assert mismatches(json.loads(json.dumps(document)), status.StatusDocument) == []


def test_a_cap_the_kernel_refuses_is_in_the_document_and_the_status_line() -> None:
    refused = WriteFailure("policy4: writing 1416000 to …: Device or resource busy", 1.7e9, 1545.6)
    refusing = snapshot(
        ts=1.7e9 + 1.5,
        temperature_c=90.0,
        domains=(
            DomainStatus("policy4", "cpufreq", 2208.0, 2208.0, 2208.0, 408.0, 2208.0, refused),
            DomainStatus("policy6", "cpufreq", 816.0, 816.0, 823.5, 408.0, 2400.0),
        ),
        state="write-failing",
    )
    serving: status.ServingDoc = {
        "pid": None,
        "state": "stopped",
        "restarts": 0,
        "last_exit": None,
        "config_error": None,
    }
    document = status.document(
        refusing, {}, status.DaemonStats()(), LoopTiming().summary(), serving, placement=placement()
    )
    assert mismatches(document, status.StatusDocument) == []
    assert document["domains"]["policy4"]["write_failure"] == {
        "error": refused.error,
        "since": 1.7e9,
        "wanted_mhz": 1545.6,
    }
    assert document["domains"]["policy6"]["write_failure"] is None
    line = "90.0 °C no meter | policy4 2208 policy6 816 MHz | write-failing: policy4"
    assert status.line(refusing) == line


def test_the_cooling_health_is_in_the_contracts_shape() -> None:
    """Every figure of the cooling's health, rounded as the document rounds; before anything
    is known, `off` with nulls and zero counts (a snapshot nobody filled in)."""
    cooling = CoolingStatus(
        "degraded", 9.98765, 36.21, 0.1234, 0.91234, 6.3212, 1.58004, 1.7e9 + 0.12345,
        1.7e9 + 9000.5, 11, 2,
    )  # fmt: skip
    cooled = snapshot(
        platform="jetson-orin", temperature_c=80.0, power_w=9.0, metered=True, cooling=cooling
    )
    serving: status.ServingDoc = {
        "pid": None,
        "state": "stopped",
        "restarts": 0,
        "last_exit": None,
        "config_error": None,
    }
    parts = (status.DaemonStats()(), LoopTiming().summary(), serving)
    document = status.document(cooled, {}, *parts, placement=placement())
    assert mismatches(document, status.StatusDocument) == []
    assert document["cooling"] == {
        "state": "degraded",
        "thermal_resistance_c_per_w": 9.988,
        "time_constant_s": 36.2,
        "intercept_c": 0.12,
        "confidence": 0.912,
        "baseline_c_per_w": 6.321,
        "drift_ratio": 1.58,
        "since": 1700000000.123,
        "updated": 1700009000.5,
        "windows": 11,
        "rejected": 2,
    }
    unknown = status.document(
        replace(cooled, cooling=CoolingStatus()), {}, *parts, placement=placement()
    )
    assert unknown["cooling"]["state"] == "off" and unknown["cooling"]["windows"] == 0
    assert mismatches(unknown, status.StatusDocument) == []


def test_the_checker_finds_a_missing_key_and_a_wrong_type() -> None:
    document: dict[str, Any] = dict(FakeBoard()())
    del document["thermal"]
    document["governor"] = {**document["governor"], "external_cap_changes": "3"}
    assert sorted(mismatches(document, status.StatusDocument)) == [
        "document.governor.external_cap_changes: '3' is not int",
        "document: no key 'thermal'",
    ]
    openvino = {"device": "CPU", "precision": "f32", "capabilities": ["FP32", 16]}
    assert mismatches(openvino, status.OpenVinoDoc) == ["document.capabilities[1]: 16 is not str"]


def test_the_checker_finds_a_state_the_contract_does_not_name() -> None:
    document = FakeBoard()()
    document["governor"]["state"] = "lower"  # type: ignore[typeddict-item]
    document["serving"]["state"] = "ready"
    assert mismatches(document, status.StatusDocument) == [
        "document.governor.state: 'lower' is not one of its states"
    ]


def test_a_document_too_big_for_shared_memory_keeps_the_contracts_shape() -> None:
    document = FakeBoard()()
    document["temperatures"] = {f"sensor-{i:06d}-{'x' * 40}": 40.0 for i in range(6000)}
    assert len(json.dumps(document)) > STATUS_BYTES
    block = SharedBlock.create()
    try:
        block.set_status(document)
        published = block.status()
    finally:
        block.close()
    assert published is not None and mismatches(published, status.StatusDocument) == []
    assert published["temperatures"] == {} and published["domains"] == {}
    assert published["temperature_c"] == document["temperature_c"]


def test_status_before_the_governors_first_document_is_a_clear_503(tmp_path: Path) -> None:
    served = Served(config(tmp_path, []), status=lambda: None)
    try:
        with served.client() as client:
            reply = client.request("GET", "/v2/mcpd/status")
    finally:
        served.close()
    assert reply.status == 503
    assert "has not published its status yet" in json.loads(reply.body)["error"]


def test_the_serving_tests_document_is_a_whole_one() -> None:
    assert mismatches(status_document(), status.StatusDocument) == []


def test_metrics_before_the_governors_first_document_are_the_models_only() -> None:
    before = metrics.Exposition(lambda: None, lambda: {"m": ModelStats(True, 3)})
    lines = before.render("")[0].decode().splitlines()
    assert 'mcpd_inference_requests_total{model="m"} 3.0' in lines
    assert not [line for line in lines if line.startswith("mcpd_temperature")]
    after = metrics.Exposition(status_document, dict).render("")[0].decode()
    assert "mcpd_temperature_celsius 61.5" in after.splitlines()
