"""`mcpctl fleet --from URL`: the fleet table from a real VictoriaMetrics, filled through its own
import API with the series `mcpctl ingest` writes (the board's /metrics names, labelled by device),
alone and with the statuses of a real broker."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from mcpd.ctl import main
from tests.support.engines import missing
from tests.support.fleet_series import board_series
from tests.support.mqtt_broker import Mosquitto, mosquitto_binary, publishing, recording, settings
from tests.support.stores import VictoriaMetrics

pytestmark = pytest.mark.skipif(
    missing("victoria-metrics") is not None, reason=missing("victoria-metrics") or ""
)


def snapshot(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, dict[str, Any]]:
    assert main(["fleet", *argv, "--json", "--count", "1", "--interval", "0"]) == 0
    return {d["device"]: d for d in json.loads(capsys.readouterr().out)["devices"]}


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with VictoriaMetrics(tmp_path / "vm") as vm:
        now = time.time()
        # The store answers for whole seconds: a sample of this very second is not seen yet.
        vm.import_prometheus(
            board_series("hot", now - 2, 88.5, (100, 350))
            + board_series("cool", now - 2, 41.0, (0, 0), drift=1.4)
            + board_series("gone", now - 20, 60.0, (5, 5))
        )
        yield vm


def test_the_table_from_the_store(
    store: VictoriaMetrics, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = snapshot(capsys, "--from", store.url, "--heartbeat", "1")
    assert list(rows) == ["hot", "gone", "cool"]  # hottest first
    hot = rows["hot"]
    assert (hot["online"], hot["platform"], hot["temperature_c"], hot["power_w"]) == (
        True,
        "rk3588",
        88.5,
        9.5,
    )
    assert hot["caps_mhz"] == {"policy0": 1200.0, "fb000000.gpu": 600.0}
    assert hot["governor"] == "lowering"
    assert hot["requests_per_s"] == pytest.approx(25.0, rel=0.2)
    assert 1.5 <= hot["last_seen_s"] < 10
    assert rows["cool"]["requests_per_s"] == 0.0
    assert (hot["cooling"], hot["drift_ratio"]) == ("normal", 1.0)
    assert (rows["cool"]["cooling"], rows["cool"]["drift_ratio"]) == ("degraded", 1.4)
    worst_cooling = snapshot(capsys, "--from", store.url, "--sort", "drift")
    assert list(worst_cooling) == ["cool", "hot", "gone"]  # then hottest first
    # Not heard from for 3 x heartbeat_s: offline, though nothing said so.
    assert (rows["gone"]["online"], rows["gone"]["last_seen_s"] >= 19) == (False, True)
    # The store picks the hottest: the others are never asked for.
    hottest = snapshot(capsys, "--from", store.url, "--heartbeat", "1", "--top", "2")
    assert list(hottest) == ["hot", "gone"]
    assert {**hottest["hot"], "last_seen_s": None} == {**hot, "last_seen_s": None}


@pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")
def test_with_a_broker_the_statuses_come_from_it_and_the_numbers_from_the_store(
    store: VictoriaMetrics, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        Mosquitto(tmp_path / "broker") as broker,
        publishing(settings(broker), tmp_path / "hot", "hot"),
        recording(broker, "mcpd/hot/status") as recorder,
    ):
        recorder.wait_for("mcpd/hot/status")
        rows = snapshot(capsys, "--from", store.url, "--broker", f"127.0.0.1:{broker.port}")
    assert rows["hot"]["online"] is True
    assert rows["hot"]["temperature_c"] == 88.5  # the store's, not the board's telemetry (60-69)
    assert rows["cool"]["online"] is None  # no status heard on this broker
