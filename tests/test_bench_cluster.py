"""bench/mqtt_cluster.py's yardstick (bench/cluster_measures.py): what counts as a gap, a
duplicate, a silence, a latency and a sample the store lacks. Records in, figures out."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import PROJECT

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
