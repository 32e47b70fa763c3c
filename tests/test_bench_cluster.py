"""bench/mqtt_cluster.py's yardstick (bench/cluster_measures.py): what counts as a gap, a
duplicate, a silence, a latency and a sample the store lacks; and where a message went missing
(bench/cluster_stages.py), read from `mcpctl ingest --log-level debug` as it writes it. Records
in, figures out."""

from __future__ import annotations

import logging
import sys

import pytest

from mcpd.logs import FORMAT
from tests.conftest import PROJECT
from tests.ctl.test_ingest_parts import Store, deliveries, writer

sys.path.insert(0, str(PROJECT / "bench"))
from cluster_measures import (  # bench/cluster_measures.py: a script's module, not a package
    Heard,
    Visibility,
    by_device,
    gaps,
    holes,
    latencies,
    percentile,
    silences,
    store_check,
    twice,
)
from cluster_stages import ingest_log, stages

from mcpd.ctl.ingest_metrics import Counters


def heard(device: str, seq: int, at: float) -> Heard:
    """A message made at `seq` seconds, received at `at`."""
    return Heard(device, seq, float(seq), at)


def test_a_number_never_received_is_a_gap_and_one_received_again_a_duplicate() -> None:
    a = [heard("a", 1, 1.1), heard("a", 2, 2.1), heard("a", 4, 4.1), heard("a", 2, 5.0)]
    boards = by_device([*a, heard("b", 1, 1.1), heard("b", 2, 2.1)])
    assert gaps(boards) == {"a": 1, "b": 0}
    assert holes(boards) == [(heard("a", 2, 2.1), 3)]
    assert twice(boards) == {"a": 1, "b": 0}


def test_the_longest_silence_is_between_arrivals_within_the_window() -> None:
    boards = by_device([heard("a", s, at) for s, at in [(1, 1.0), (2, 2.0), (3, 9.5), (4, 10.0)]])
    assert silences(boards, 0.0, 20.0) == {"a": 7.5}
    assert silences(boards, 9.0, 20.0) == {"a": 0.5}


def test_a_message_is_queryable_at_the_first_poll_whose_newest_sample_reaches_it() -> None:
    seen = Visibility()
    seen.record(10.0, {"a": 8.0})
    seen.record(10.1, {"a": 8.0})  # nothing newer: not a new point
    seen.record(10.2, {"a": 9.0})
    assert seen.polls["a"] == ([10.0, 10.2], [8.0, 9.0])
    assert seen.queryable_at("a", 8.0) == 10.0
    assert seen.queryable_at("a", 8.5) == 10.2
    assert seen.queryable_at("a", 9.5) is None
    assert seen.queryable_at("b", 1.0) is None
    found, unseen = latencies([heard("a", 8, 8.1), heard("a", 9, 9.1)], seen, 0.0, 10.0)
    assert found == pytest.approx([2.0, 1.2])
    assert unseen == 0
    _, unseen = latencies([heard("a", 9, 9.1), Heard("a", 10, 9.5, 9.6)], seen, 0.0, 10.0)
    assert unseen == 1


def test_the_store_lacks_a_received_number_or_holds_a_sample_twice() -> None:
    boards = by_device([heard("a", 1, 1.1), heard("a", 2, 2.1), heard("a", 2, 2.5)])
    assert store_check(boards, {"a": [1000, 2000]}) == ([], 0)
    assert store_check(boards, {"a": [1000]}) == ([heard("a", 2, 2.5)], 0)
    assert store_check(boards, {"a": [1000, 2000, 2000]}) == ([], 1)
    assert [m.seq for m in store_check(boards, {})[0]] == [1, 2]


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 51.0
    assert percentile(values, 99) == 100.0
    assert percentile([], 50) is None


def test_the_ingests_debug_lines_tell_what_it_was_delivered_wrote_and_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "mcpctl.ingest")
    w = writer(Store(), Counters(), [])
    assert w.write(w.messages([*deliveries(1, 2), *deliveries(5, device="b2"), *deliveries(2)]))
    deliveries_seen = [
        "DEBUG mcpctl.ingest: mcpd/b1/telemetry: mid 1, connection 1",
        "DEBUG mcpctl.ingest: mcpd/b1/telemetry: mid 2 dup, connection 1",
        "DEBUG mcpctl.ingest: mcpd/b1/status: mid 3, connection 1",
    ]
    text = [logging.Formatter(FORMAT).format(r) for r in caplog.records]
    log = ingest_log([*deliveries_seen, *text])
    assert log.written == {("b1", 1): 1000, ("b1", 2): 2000, ("b2", 5): 5000}
    assert dict(log.taken_before) == {("b1", 2): 1}
    assert (dict(log.deliveries), log.dup_flagged) == ({"b1": 2}, 1)


def test_each_stage_is_compared_with_the_one_before_it() -> None:
    log = ingest_log(
        [
            *[f"DEBUG mcpctl.ingest: mcpd/a/telemetry: mid {i}, connection 1" for i in (1, 2)],
            "DEBUG mcpctl.ingest: written: a:1:1000 a:None:1500 a:2:2000",
        ]
    )
    found = stages(
        acked={"a": [1, 2, 3]},
        heard={("a", 1): 1.0, ("a", 2): 2.0, ("a", 3): 3.0},
        log=log,
        stored={"export": {"a": [1000]}, "export_settled": {"a": [1000, 2000]}},
        killed_at=2.5,
    )
    assert found["acked_not_heard"] == []
    assert found["acked_not_written"] == found["heard_not_written"] == [("a", 3, 0.5)]
    assert found["deliveries_unaccounted"] == {}
    assert found["written_not_stored_export"] == [("a", 2, -0.5)]
    assert found["written_not_stored_export_settled"] == []
    assert found["stored_late"] == [("a", 2, -0.5)]
