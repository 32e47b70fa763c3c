"""mcpctl ingest's parts without a broker or a store: a message as samples, the duplicate window,
the order and encoding of a request, the subscriptions N processes share, and the writer's
retries and splits, driven through its `send` function."""

from __future__ import annotations

import json
from typing import Any

import cramjam
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcpd import ctl
from mcpd.backoff import Backoff
from mcpd.ctl.ingest_batch import Templates, encode
from mcpd.ctl.ingest_metrics import Counters
from mcpd.ctl.ingest_samples import Message, NotTelemetry, status, telemetry
from mcpd.ctl.ingest_service import address
from mcpd.ctl.ingest_topics import NoSharedSubscriptions, board, subscriptions, valid_group
from mcpd.ctl.ingest_window import SeqWindow
from mcpd.ctl.ingest_writer import Delivery, Writer
from mcpd.ctl.remote_write import Outcome, verdict
from mcpd.ctl.remote_write_pb2 import WriteRequest
from mcpd.serving.metrics import Exposition
from mcpd.snapshot import ModelStats
from mcpd.telemetry import encoder
from tests.support.mqtt_status import FakeBoard


def message(device: str = "b1", seq: int = 7, ts: float = 1767225600.125, **extra: Any) -> bytes:
    document = {**FakeBoard(clock=lambda: ts)(), **extra}
    return encoder.telemetry(
        document, device=device, seq=seq, requests_per_s=2.0, queued=0, dropped=0
    )


def keys(m: Message) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """Its series one by one, (name, label names, label values), in the order of its values."""
    return [(name, labels, values) for name, labels, sets in m.runs for values in sets]


def by_series(m: Message) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (n, tuple(zip(names, values, strict=True))): v
        for (n, names, values), v in zip(keys(m), m.values, strict=True)
    }


def decoded(body: bytes) -> WriteRequest:
    return WriteRequest.FromString(bytes(cramjam.snappy.decompress_raw(body)))


def test_a_telemetry_message_is_the_boards_series_at_its_own_time() -> None:
    m = telemetry("b1", message())
    assert (m.device, m.seq, m.ts_ms) == ("b1", 7, 1767225600125)
    samples = by_series(m)
    assert samples[("up", ())] == 1.0
    assert samples[("mcpd_temperature_celsius", ())] == 61.0
    assert samples[("mcpd_sensor_temperature_celsius", (("sensor", "gpu-thermal"),))] == 59.0
    assert ("mcpd_sensor_temperature_celsius", (("sensor", "tj-thermal"),)) not in samples  # null
    assert samples[("mcpd_power_watts", (("estimated", "false"),))] == 7.5
    assert samples[("mcpd_domain_cap_hertz", (("domain", "policy0"), ("kind", "cpufreq")))] == (
        round(1510.4 * 0.8 * 1e6)
    )
    assert samples[("mcpd_governor_state", (("state", "lowering"),))] == 1.0
    assert samples[("mcpd_governor_state", (("state", "holding"),))] == 0.0
    assert samples[("mcpd_governor_info", (("policy", "hysteresis"), ("profile", "default")))] == 1
    assert samples[("mcpd_build_info", (("version", "0.1.0"),))] == 1.0
    assert samples[("mcpd_serving_restarts_total", ())] == 0.0
    assert samples[("mcpd_inference_requests_total", (("model", "demo"),))] == 25.0
    assert samples[("mcpd_inference_errors_total", (("model", "demo"),))] == 1.0
    assert samples[("mcpd_model_ready", (("model", "demo"),))] == 1.0
    assert samples[("mcpd_daemon_resident_memory_bytes", ())] == round(61.2 * 2**20)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"\xff", "not JSON"),
        (b"[1]", "schema 1"),
        (json.dumps({"schema": 2, "device_id": "b1", "seq": 1, "ts": 1.0}).encode(), "schema 1"),
        (message(device="b2"), "on b1's topic"),
        (json.dumps({"schema": 1, "device_id": "b1", "seq": "7", "ts": 1.0}).encode(), "seq"),
        (json.dumps({"schema": 1, "device_id": "b1", "seq": 7, "ts": True}).encode(), "ts"),
        (message(temperatures=[1, 2]), "not a status document"),
    ],
)
def test_what_is_not_telemetry_of_the_topics_board_is_refused(payload: bytes, why: str) -> None:
    with pytest.raises(NotTelemetry, match=why):
        telemetry("b1", payload)


def test_model_counters_that_are_not_numbers_leave_the_model_out() -> None:
    m = telemetry("b1", message(inference={"demo": {"ready": True, "requests": None}}))
    assert not [key for key in keys(m) if key[0].startswith("mcpd_inference_")]


HISTOGRAMS = ("mcpd_inference_request_duration_seconds", "mcpd_inference_compute_duration_seconds")


def test_the_latency_histograms_are_the_boards_own_series_from_its_metrics() -> None:
    """The same names, `le` bounds, counts and sums as the board's /metrics renders from the
    serving process's live statistics, so the fleet dashboard's quantiles read either path."""
    board = FakeBoard(clock=lambda: 1767225600.125)
    document = board()
    statistics = board.recorder.snapshot()
    live = {"demo": ModelStats(True, 25, statistics=statistics, latency=statistics.latency)}
    body, _ = Exposition(lambda: document, lambda: live).render("")
    scraped = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        if family.name in HISTOGRAMS
        for s in family.samples
    }
    payload = encoder.telemetry(
        document, device="b1", seq=1, requests_per_s=2.0, queued=0, dropped=0
    )
    ingested = {
        (name, tuple(sorted(labels))): value
        for (name, labels), value in by_series(telemetry("b1", payload)).items()
        if name.startswith(HISTOGRAMS)
    }
    assert len(scraped) == 2 * (15 + 2)  # 14 bounds and +Inf, the sum and the count
    assert ingested == pytest.approx(scraped, abs=1e-6)  # the sum in µs, as the status has it
    assert ingested[("mcpd_inference_request_duration_seconds_count", (("model", "demo"),))] == 25


def test_a_model_without_whole_histograms_has_no_histogram_series() -> None:
    """An older board's message has no `latency`; a broken one's part is left out, not fatal."""
    demo = telemetry("b1", message())
    for broken in (None, {"request": {"buckets": [1, 2], "count": 3, "sum_s": 0.1}}):
        doc = json.loads(message())["inference"]
        doc["demo"]["latency"] = broken
        m = telemetry("b1", message(inference=doc))
        assert not [key for key in keys(m) if key[0].startswith(HISTOGRAMS)]
        assert len(keys(m)) == len(keys(demo)) - 2 * (15 + 2)


def test_offline_is_up_0_at_arrival_and_online_says_nothing() -> None:
    down = status("b1", b"offline", now=1000.5)
    assert down == Message("b1", None, 1000500, [("up", (), ((),))], [0.0])
    assert status("b1", b"online", now=1000.5) is None


def test_the_window_drops_a_number_seen_and_lets_new_and_late_ones_through() -> None:
    window = SeqWindow(size=8)
    assert [window.first_time("b1", s) for s in (5, 6, 5, 4, 4, 10)] == [
        True, True, False, True, False, True,
    ]  # fmt: skip
    assert window.first_time("b2", 5)  # per board
    assert not window.first_time("b1", 6)  # still inside 10's window of 8
    assert window.first_time("b1", 2)  # older than the window: let through, never dropped
    assert window.first_time("b1", 100) and not window.first_time("b1", 100)
    assert window.first_time("b1", 10)  # 90 behind: out of the window now


def test_shared_by_a_group_where_granted_else_refused_with_the_partitioning() -> None:
    assert subscriptions("mcpd/site-1", None, True) == [
        "mcpd/site-1/+/telemetry", "mcpd/site-1/+/status",
    ]  # fmt: skip
    assert subscriptions("mcpd", "ingest", True) == [
        "$share/ingest/mcpd/+/telemetry", "$share/ingest/mcpd/+/status",
    ]  # fmt: skip
    assert subscriptions("mcpd", None, False) == ["mcpd/+/telemetry", "mcpd/+/status"]
    with pytest.raises(NoSharedSubscriptions, match="one mcpctl ingest per site prefix"):
        subscriptions("mcpd", "ingest", False)
    assert valid_group("ingest-1") and not valid_group("a/b") and not valid_group("#")
    assert board("mcpd/site-1/b1/telemetry", "mcpd/site-1") == ("b1", "telemetry")
    assert board("mcpd/site-2/b1/telemetry", "mcpd/site-1") is None
    assert board("mcpd/site-1/b1/events", "mcpd/site-1") is None


def test_a_request_has_every_series_labels_sorted_samples_in_time_order() -> None:
    late = telemetry("b1", message(seq=8, ts=1767225601.0))
    early = telemetry("b1", message(seq=7, ts=1767225600.0))
    other = telemetry("b2", message(device="b2", seq=1, ts=1767225600.5))
    templates = Templates("fleet")
    request = decoded(encode([late, other, early], templates))
    assert len(request.timeseries) == len(late.values) + len(early.values) + len(other.values)
    stamps: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for timeseries in request.timeseries:
        names = [label.name for label in timeseries.labels]
        assert names == sorted(names) and "__name__" in names
        labels = {label.name: label.value for label in timeseries.labels}
        assert labels["job"] == "fleet" and labels["instance"] in ("b1", "b2")
        stamps.setdefault(tuple(sorted(labels.items())), []).extend(
            s.timestamp for s in timeseries.samples
        )
    for series, times in stamps.items():
        b1 = dict(series)["instance"] == "b1"
        assert times == ([1767225600000, 1767225601000] if b1 else [1767225600500])
    # the same series again is the same template, its values and time set
    again = telemetry("b1", message(seq=9, ts=1767225602.0, temperature_c=70.5))
    (only,) = [
        t for t in decoded(encode([again], templates)).timeseries
        if {label.value for label in t.labels} == {"mcpd_temperature_celsius", "b1", "fleet"}
    ]  # fmt: skip
    assert [(s.value, s.timestamp) for s in only.samples] == [(70.5, 1767225602000)]


def test_a_board_whose_series_change_is_written_with_its_new_series() -> None:
    """Boards of one shape share a template; one that gains a sensor has a shape of its own,
    and past the limit of shapes the templates start again rather than grow."""
    templates = Templates("fleet", limit=2)
    plain = telemetry("b1", message(seq=1))
    more = telemetry("b2", message(device="b2", seq=1, temperatures={"extra": 41.5}))
    body = decoded(encode([plain, more], templates))
    sensors = {
        (labels["instance"], labels.get("sensor"))
        for labels in ({x.name: x.value for x in t.labels} for t in body.timeseries)
        if labels["__name__"] == "mcpd_sensor_temperature_celsius"
    }
    assert ("b2", "extra") in sensors and ("b1", "extra") not in sensors
    odd = telemetry("b3", message(device="b3", seq=1, temperatures={"odd": 1.0}))
    assert len(decoded(encode([odd], templates)).timeseries) == len(odd.values)
    assert len(templates._shapes) == 1  # the third shape: started again


class Store:
    """A store as the writer sees it: each request's messages, answered from a script."""

    def __init__(self, *answers: str, refuse: set[int] | None = None) -> None:
        self.answers = list(answers)
        self.refuse = refuse or set()
        """Samples (by time, ms) the store refuses: a request holding one is a 400."""
        self.requests: list[list[int]] = []
        """Each request's sample times (ms)."""

    def send(self, body: bytes) -> Outcome:
        stamps = sorted({s.timestamp for t in decoded(body).timeseries for s in t.samples})
        self.requests.append(stamps)
        if self.answers:
            return Outcome(verdict(int(self.answers.pop(0))), "scripted")
        return Outcome("rejected" if self.refuse & set(stamps) else "accepted", "")


def writer(store: Store, counters: Counters, waits: list[float], stop_after: int = 99) -> Writer:
    return Writer(
        "mcpd",
        store.send,
        Templates("mcpd"),
        counters,
        wall=lambda: 1000.0,
        monotonic=lambda: 0.0,
        wait=lambda s: waits.append(s) or len(waits) >= stop_after,
        backoff=Backoff(0.5, 30.0),
    )


def deliveries(*seqs: int, device: str = "b1") -> list[Delivery]:
    return [
        Delivery(f"mcpd/{device}/telemetry", message(device, seq, ts=seq), seq, 1, 1)
        for seq in seqs
    ]


def test_duplicates_and_strangers_are_dropped_before_the_write() -> None:
    counters = Counters()
    w = writer(Store(), counters, [])
    stranger = Delivery("mcpd/b1/telemetry", b"{}", 9, 1, 1)
    taken = w.messages([*deliveries(1, 2, 1), stranger, *deliveries(2)])
    assert [m.seq for m in taken] == [1, 2]
    assert (counters.duplicates, counters.invalid) == (2, 1)


def test_a_failed_request_is_sent_again_after_a_backoff_until_accepted() -> None:
    store, counters, waits = Store("503", "429", "204"), Counters(), []
    w = writer(store, counters, waits)
    assert w.write(w.messages(deliveries(1, 2)))
    assert store.requests == [[1000, 2000]] * 3
    assert waits == [0.5, 1.0]
    assert (counters.write_failures, counters.written, counters.lag_s) == (2, 2, 998.0)


def test_a_store_that_stays_away_leaves_the_batch_unwritten_when_told_to_stop() -> None:
    store, counters, waits = Store(*["500"] * 5), Counters(), []
    w = writer(store, counters, waits, stop_after=3)
    assert not w.write(w.messages(deliveries(1)))
    assert counters.written == 0 and len(store.requests) == 3


def test_a_refused_request_is_split_down_to_the_message_the_store_refuses() -> None:
    store, counters = Store(refuse={3000}), Counters()
    w = writer(store, counters, [])
    assert w.write(w.messages(deliveries(1, 2, 3, 4)))
    assert store.requests == [[1000, 2000, 3000, 4000], [1000, 2000], [3000, 4000], [3000], [4000]]
    assert (counters.written, counters.rejected, counters.write_rejections) == (3, 1, 3)


def test_addresses_and_what_mcpctl_ingest_refuses_before_it_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert address("broker.lan:1884", 1883) == ("broker.lan", 1884)
    assert address("broker.lan", 8883) == ("broker.lan", 8883)
    assert address("[::1]:1884", 1883) == ("::1", 1884)
    assert address("::1", 1883) == ("::1", 1883)
    with pytest.raises(ValueError, match="port"):
        address("broker.lan:x", 1883)
    common = ["ingest", "--broker", "127.0.0.1:1", "--remote-write"]
    for argv, why in (
        ([*common, "ftp://store"], "is not an http(s) URL"),
        ([*common, "http://store", "--group", "a/b"], "may not hold"),
        ([*common, "http://store", "--group", "g", "--protocol", "3.1.1"], "3.1.1 has no shared"),
        ([*common, "http://store", "--metrics-listen", "127.0.0.1:99999"], "port"),
    ):
        assert ctl.main(argv) == 2
        assert why in capsys.readouterr().err
