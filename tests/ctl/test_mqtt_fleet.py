"""`mcpctl fleet`: several simulated boards on one broker, shown hottest first."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest

from mcpd.ctl import main
from mcpd.ctl.fleet_view import FleetView, table
from tests.support.mqtt_broker import Mosquitto, mosquitto_binary, publishing, recording, settings
from tests.support.mqtt_status import FakeBoard


def telemetry(temperature: float | None, **extra: object) -> bytes:
    body = {
        "seq": 1,
        "platform": "rk3588",
        "temperature_c": temperature,
        "power_w": None,
        "domains": {"policy0": {"cap_mhz": 1800.0}, "fb000000.gpu": {"cap_mhz": None}},
        "governor": {"state": "holding", "last_action": None},
        "requests_per_s": 12.5,
    }
    return json.dumps({**body, **extra}).encode()


def test_the_view_sorts_hottest_first_and_keeps_what_it_cannot_read_out() -> None:
    view = FleetView("fleet/site")
    view.update("fleet/site/cool/telemetry", telemetry(41.0), now=10.0)
    view.update("fleet/site/hot/telemetry", telemetry(88.5), now=11.0)
    view.update("fleet/site/hot/status", b"online", now=11.0)
    view.update("fleet/site/gone/status", b"offline", now=11.0)
    view.update("fleet/site/hot/telemetry", b"{broken", now=11.5)  # keeps the last good one
    view.update("fleet/site/odd/telemetry", b"[1, 2]", now=11.5)
    view.update("other/x/telemetry", telemetry(99.0), now=11.5)
    view.update("fleet/site/cool/status", b"weird", now=11.5)
    rows = view.rows(now=12.0)
    assert [r.device for r in rows] == ["hot", "cool", "gone"]
    hot, cool, gone = rows
    assert (hot.online, hot.temperature_c, hot.last_seen_s) == (True, 88.5, 1.0)
    assert hot.caps_mhz == {"policy0": 1800.0, "fb000000.gpu": None}
    assert (hot.governor, hot.requests_per_s, hot.power_w) == ("holding", 12.5, None)
    assert cool.online is None and (gone.online, gone.last_seen_s) == (False, None)
    lines = table(rows).splitlines()
    assert lines[0].split()[:3] == ["DEVICE", "ONLINE", "PLATFORM"]
    assert lines[1].split() == [
        "hot",
        "yes",
        "rk3588",
        "88.5",
        "-",
        "policy0",
        "1800",
        "gpu",
        "-",
        "holding",
        "-",
        "12.5",
        "1.0",
        "s",
    ]
    assert lines[3].split()[:2] == ["gone", "NO"]


def test_the_view_sorts_the_worst_cooling_first_on_request() -> None:
    """`--sort drift`: the thermal resistance furthest over its baseline first; a board still
    learning, or one that does not say, after those that do (hottest first among them)."""
    view = FleetView("mcpd")

    def cooling(state: str, drift: float | None) -> dict[str, object]:
        return {"cooling": {"state": state, "drift_ratio": drift}}

    view.update("mcpd/worn/telemetry", telemetry(60.0, **cooling("degraded", 1.41)), now=1.0)
    view.update("mcpd/fine/telemetry", telemetry(85.0, **cooling("normal", 1.02)), now=1.0)
    view.update("mcpd/new/telemetry", telemetry(70.0, **cooling("learning", None)), now=1.0)
    view.update("mcpd/old/telemetry", telemetry(90.0), now=1.0)  # an mcpd before cooling health
    view.update("mcpd/rising/telemetry", telemetry(50.0, **cooling("rising", 1.3)), now=1.0)
    assert [r.device for r in view.rows(2.0)] == ["old", "fine", "new", "worn", "rising"]
    rows = view.rows(2.0, "drift")
    assert [r.device for r in rows] == ["worn", "rising", "fine", "old", "new"]
    assert (rows[0].cooling, rows[0].drift_ratio, rows[3].cooling) == ("degraded", 1.41, None)
    lines = table(rows).splitlines()
    assert lines[0].split()[10] == "COOLING"
    assert [line.split()[10:12] for line in lines[1:]] == [
        ["degraded", "x1.41"],
        ["rising", "x1.30"],
        ["normal", "x1.02"],
        ["-", "12.5"],
        ["learning", "12.5"],
    ]


@pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")
def test_fleet_json_shows_every_simulated_board_hottest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Mosquitto(tmp_path / "broker") as broker, ExitStack() as boards:
        for name, base in (("edge-a", 45.0), ("edge-b", 80.0), ("edge-c", 60.0), ("gone", 30.0)):
            folder = tmp_path / name
            folder.mkdir()
            publisher = boards.enter_context(
                publishing(settings(broker), folder, name, FakeBoard(base))
            )
            if name == "gone":
                with recording(broker, "mcpd/gone/telemetry") as recorder:
                    recorder.wait_for("mcpd/gone/telemetry")
                publisher.stop()  # clean stop: retained offline
        argv = [
            "fleet",
            "--broker",
            f"127.0.0.1:{broker.port}",
            "--json",
            "--count",
            "2",
            "--interval",
            "0.6",
        ]
        assert main(argv) == 0
    snapshots = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(snapshots) == 2
    devices = snapshots[-1]["devices"]
    assert [d["device"] for d in devices] == ["edge-b", "edge-c", "edge-a", "gone"]
    assert [d["online"] for d in devices] == [True, True, True, False]
    assert 80 <= devices[0]["temperature_c"] < 90
    assert devices[0]["caps_mhz"].keys() == {"policy0", "17000000.gpu"}
    assert devices[0]["platform"] == "jetson-orin" and devices[0]["governor"] in {
        "lowering",
        "holding",
    }
    assert devices[0]["requests_per_s"] > 0 and devices[0]["last_seen_s"] < 1.0
    assert devices[3]["temperature_c"] is None  # never seen telemetry since we subscribed


def test_fleet_names_a_broker_it_cannot_reach(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.mqtt_broker import free_port

    assert main(["fleet", "--broker", f"127.0.0.1:{free_port()}", "--count", "1"]) == 1
    assert "mcpctl fleet: cannot connect to 127.0.0.1:" in capsys.readouterr().err


def test_a_board_not_heard_from_for_three_heartbeats_is_offline_whatever_it_last_said() -> None:
    """Its node died with it: no Will, and on MQTT 3.1.1 its retained `online` never expires."""
    view = FleetView("mcpd", heartbeat_s=1.0)
    view.update("mcpd/b1/status", b"online", now=100.0)
    assert view.rows(now=102.9)[0].online is True
    assert view.rows(now=103.1)[0].online is False
    view.update("mcpd/b1/telemetry", telemetry(50.0), now=103.5)  # telemetry is word of it too
    assert view.rows(now=106.4)[0].online is True
    view.update("mcpd/b1/status", b"offline", now=106.5)  # its Will, or its clean stop
    assert view.rows(now=106.6)[0].online is False
    # Without the statuses (`--from` alone), online is heard from within the same time.
    stored = FleetView("mcpd", heartbeat_s=1.0, statuses=False)
    stored.measured("b2", 100.0, {"temperature_c": 40.0})
    assert [(r.device, r.online) for r in stored.rows(now=102.0)] == [("b2", True)]
    assert [(r.device, r.online) for r in stored.rows(now=104.0)] == [("b2", False)]


def test_sites_narrow_the_view_to_their_boards() -> None:
    view = FleetView("mcpd", sites=("s1", "s3"))
    assert view.bases() == ["mcpd/s1", "mcpd/s3"]
    view.update("mcpd/s1/b1/telemetry", telemetry(60.0), now=1.0)
    view.update("mcpd/s2/b2/telemetry", telemetry(70.0), now=1.0)  # another site
    view.update("mcpd/s3/b3/status", b"online", now=1.0)
    view.update("mcpd/b4/telemetry", telemetry(80.0), now=1.0)  # no site level
    rows = view.rows(now=1.5)
    assert [(r.site, r.device, r.online) for r in rows] == [("s1", "b1", None), ("s3", "b3", True)]
    assert table(rows).splitlines()[1].split()[0] == "s1/b1"
    every = FleetView("mcpd", sites=("+",))
    every.update("mcpd/s2/b2/telemetry", telemetry(70.0), now=1.0)
    assert [r.site for r in every.rows(now=1.0)] == ["s2"]


@pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")
def test_fleet_follows_only_the_sites_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Mosquitto(tmp_path / "broker") as broker, ExitStack() as boards:
        for site, name in (("s1", "a"), ("s2", "b"), ("s1", "c")):
            mqtt = settings(broker, topic_prefix=f"mcpd/{site}")
            boards.enter_context(publishing(mqtt, tmp_path / name, name))
        with recording(broker, "mcpd/+/+/telemetry") as recorder:
            recorder.wait(
                lambda ms: {m.topic for m in ms} >= {f"mcpd/s1/{d}/telemetry" for d in "ac"}
            )
        argv = ["fleet", "--broker", f"127.0.0.1:{broker.port}", "--site", "s1", "--json"]
        assert main([*argv, "--count", "1", "--interval", "0.6"]) == 0
    devices = json.loads(capsys.readouterr().out)["devices"]
    assert sorted((d["site"], d["device"], d["online"]) for d in devices) == [
        ("s1", "a", True),
        ("s1", "c", True),
    ]
    assert all(d["temperature_c"] is not None for d in devices)


def test_fleet_says_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "--count", "1"]) == 2
    assert "give --broker, --from or both" in capsys.readouterr().err
    assert main(["fleet", "--from", "http://127.0.0.1:1", "--site", "s1"]) == 2
    assert "--site narrows the broker's topics: it needs --broker" in capsys.readouterr().err
    from tests.support.mqtt_broker import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["fleet", "--from", url, "--count", "1", "--interval", "0"]) == 1
    assert f"mcpctl fleet: cannot query {url}: " in capsys.readouterr().err
