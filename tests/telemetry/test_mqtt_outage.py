"""No data lost: broker outages, a slow broker, daemon restarts and a full spool.

The consumer here is what a fleet runs: a persistent MQTT 5 session on a broker that keeps
sessions across its own restart, so that whatever the boards deliver while the consumer is
reconnecting waits for it at the broker. Any gap the tests find is then the board's.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.events import Event
from tests.support.mqtt_broker import (
    Mosquitto,
    Recorder,
    mosquitto_binary,
    publishing,
    recording,
    settings,
)
from tests.support.mqtt_status import FakeBoard
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")

T = "mcpd/b1/telemetry"
E = "mcpd/b1/events"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with Mosquitto(tmp_path / "broker", persistent=True) as broker:
        yield broker


@pytest.fixture
def fleet(broker: Mosquitto) -> Iterator[Recorder]:
    with recording(broker, T, E, session="fleet-consumer") as recorder:
        yield recorder


def seqs(recorder: Recorder) -> list[int]:
    return [m.json()["seq"] for m in recorder.on(T)]


def first_seen(values: list[int]) -> list[int]:
    """In arrival order without the repeats QoS 1 allows after a reconnect."""
    seen: set[int] = set()
    return [v for v in values if not (v in seen or seen.add(v))]  # type: ignore[func-returns-value]


@pytest.mark.slow
def test_a_20_s_broker_outage_loses_nothing_and_keeps_the_order(
    broker: Mosquitto, fleet: Recorder, tmp_path: Path
) -> None:
    with publishing(settings(broker), tmp_path) as publisher:
        fleet.wait_for(T, 5)
        broker.stop()
        outage_ends = time.monotonic() + 20
        for n in range(4):  # events during the outage are spooled between the telemetry
            publisher.submit(Event("governor", f"action {n}"))
            time.sleep(2)
        time.sleep(max(0.0, outage_ends - time.monotonic()))
        broker.start()
        last_before = max(seqs(fleet))
        fleet.wait(lambda _: max(seqs(fleet)) >= last_before + 110, timeout=30)
    order = first_seen(seqs(fleet))
    assert order == list(range(len(order))), "a gap or a reordering"
    spooled = [m.json()["spool"]["queued"] for m in fleet.on(T)]
    assert max(spooled) >= 50  # 20 s at 5 Hz waited in the spool (a starved thread skips ticks)
    events = [m.json() for m in fleet.on(E)]
    assert [e["message"] for e in events] == [f"action {n}" for n in range(4)]
    telemetry = [m.json() for m in fleet.on(T)]
    for event in events:  # each event arrived among the telemetry sampled around it
        index = next(i for i, m in enumerate(fleet.messages) if m.topic == E and m.json() == event)
        before = [m.json()["ts"] for m in fleet.messages[:index] if m.topic == T]
        after = [m.json()["ts"] for m in fleet.messages[index:] if m.topic == T]
        assert before[-1] <= event["ts"] <= after[0]
    assert telemetry[-1]["spool"]["dropped"] == 0


def test_a_slow_broker_only_fills_the_spool(
    broker: Mosquitto, fleet: Recorder, tmp_path: Path
) -> None:
    assert broker.process is not None
    with publishing(settings(broker, telemetry_ms=100), tmp_path) as publisher:
        fleet.wait_for(T, 3)
        broker.process.send_signal(signal.SIGSTOP)  # connected, but nothing is acknowledged
        try:
            # Were submit() to wait on the broker, this would hang: the broker is stopped.
            for n in range(200):
                publisher.submit(Event("fault", f"storm {n}"))
            time.sleep(3)
        finally:
            broker.process.send_signal(signal.SIGCONT)
        fleet.wait(lambda _: len(fleet.on(E)) >= 200, timeout=20)
        fleet.wait(lambda _: len(first_seen(seqs(fleet))) >= 35, timeout=20)
    order = first_seen(seqs(fleet))
    assert order == list(range(len(order)))
    assert [m.json()["message"] for m in fleet.on(E)] == [f"storm {n}" for n in range(200)]


def test_the_spool_outlives_a_daemon_restart_and_seq_carries_on(
    broker: Mosquitto, fleet: Recorder, tmp_path: Path
) -> None:
    broker.stop()
    board = FakeBoard()
    with publishing(settings(broker), tmp_path, status=board) as publisher:
        wait_until(lambda: board.calls >= 5, 10, "5 samples")
        publisher.submit(Event("daemon", "stopping"))
    sampled_in_first_run = board.calls
    with publishing(settings(broker), tmp_path, status=board):  # same state dir
        wait_until(lambda: board.calls >= sampled_in_first_run + 3, 10, "3 more samples")
        broker.start()
        fleet.wait(lambda _: len(fleet.on(T)) >= sampled_in_first_run + 3, timeout=20)
    order = first_seen(seqs(fleet))
    assert order == list(range(len(order)))
    assert len(order) >= sampled_in_first_run + 3
    assert [m.json()["message"] for m in fleet.on(E)] == ["stopping"]


def test_a_full_spool_drops_the_oldest_telemetry_keeps_events_and_says_how_many(
    broker: Mosquitto, fleet: Recorder, tmp_path: Path
) -> None:
    broker.stop()
    board = FakeBoard()
    mqtt = settings(broker, spool_messages=10, telemetry_ms=100)
    with publishing(mqtt, tmp_path, status=board) as publisher:
        publisher.submit(Event("fault", "early fault"))
        wait_until(lambda: board.calls >= 25, 10, "25 samples")
        broker.start()
        fleet.wait(lambda _: len(fleet.on(E)) >= 1 and len(fleet.on(T)) >= 12, timeout=20)
    assert [m.json()["message"] for m in fleet.on(E)] == ["early fault"]
    bodies = [m.json() for m in fleet.on(T)]
    first = bodies[0]["seq"]
    assert first >= 25 - 9  # the oldest telemetry went; 9 places were left beside the event
    assert [b["seq"] for b in bodies] == list(range(first, first + len(bodies)))
    # Sample s found s - 9 samples dropped before it (the spool held the event and 9 samples),
    # until the broker came back and dropping stopped: each drop is in the next sample made.
    for body in bodies:
        assert body["spool"]["dropped"] == min(max(0, body["seq"] - 9), first), body["seq"]


def test_a_flood_of_one_kind_of_event_leaves_the_outages_telemetry_and_other_events_their_room(
    broker: Mosquitto, fleet: Recorder, tmp_path: Path
) -> None:
    """Issue 26: failing loads in a loop while the broker was away filled the spool with model
    events, and every telemetry message of the outage was dropped to make room for them."""
    broker.stop()
    board = FakeBoard()
    mqtt = settings(broker, spool_messages=100, telemetry_ms=100)
    with publishing(mqtt, tmp_path, status=board) as publisher:
        publisher.submit(Event("governor", "an action before the flood"))
        failures = 0
        while board.calls < 20:  # 20 samples, each among hundreds of model events
            for _ in range(50):
                publisher.submit(Event("model", f"model bad failed to load ({failures})"))
                failures += 1
            time.sleep(0.02)
        sampled = board.calls

        def drained() -> Any:
            """The first telemetry made once the spool was delivered: after the last drop."""
            bodies = (m.json() for m in fleet.on(T))
            return next(
                (b for b in bodies if b["seq"] >= sampled and b["spool"]["queued"] <= 1), None
            )

        broker.start()
        fleet.wait(lambda _: drained() is not None, timeout=20)
    order = first_seen(seqs(fleet))
    assert order[:sampled] == list(range(sampled)), "telemetry of the outage dropped"
    events = [m.json()["message"] for m in fleet.on(E)]
    assert events[0] == "an action before the flood"
    models = events[1:]
    assert f"model bad failed to load ({failures - 1})" in models  # the newest were kept
    assert len(models) <= 100 - sampled
    assert drained()["spool"]["dropped"] == failures - len(set(models))
