"""The dynamic batching rule, driven directly with a made-up clock."""

from __future__ import annotations

from mcpd.serving.batching import Dispatch, Queued, RecentPeak, decide

A = (4,)  # a non-batch shape key


def q(*rows: int, arrived: float = 0.0, key: object = A) -> list[Queued]:
    return [Queued(n, key, arrived) for n in rows]


def test_empty_queue_waits_for_arrivals() -> None:
    assert decide([], 5.0, 8, (), 0.002, 1) == Dispatch(0, None)


def test_full_batch_goes_at_once() -> None:
    assert decide(q(2, 2, 2, 2, 1), 0.0, 8, (), 0.002, 1) == Dispatch(4)


def test_partial_batch_waits_for_the_oldest_delay_then_goes() -> None:
    queue = q(1, 1, arrived=10.0)
    assert decide(queue, 10.0005, 8, (), 0.002, 1) == Dispatch(0, 10.002)
    assert decide(queue, 10.002, 8, (), 0.002, 1) == Dispatch(2)


def test_zero_delay_never_waits() -> None:
    assert decide(q(1), 0.0, 8, (), 0.0, 1) == Dispatch(1)


def test_batch_that_cannot_grow_goes_at_once() -> None:
    # The next request would overflow the governor's batch size...
    assert decide(q(3, 3, 3), 0.0, 8, (), 1.0, 1) == Dispatch(2)
    # ...or has other non-batch dimensions.
    mixed = [Queued(1, (4,), 0.0), Queued(1, (5,), 0.0)]
    assert decide(mixed, 0.0, 8, (), 1.0, 1) == Dispatch(1)


def test_governor_batch_size_bounds_the_batch() -> None:
    assert decide(q(1, 1, 1, 1), 0.0, 2, (), 1.0, 1) == Dispatch(2)


def test_request_larger_than_the_current_batch_size_runs_alone() -> None:
    assert decide(q(6, 1), 0.0, 4, (), 1.0, 1) == Dispatch(1)


def test_largest_preferred_size_goes_without_waiting() -> None:
    assert decide(q(1, 1, 1, 1, 1), 0.0, 8, (2, 4), 1.0, 1) == Dispatch(4)
    assert decide(q(1, 1, 1), 0.0, 8, (2, 4), 1.0, 1) == Dispatch(2)
    assert decide(q(1), 0.0, 8, (2, 4), 1.0, 1) == Dispatch(0, 1.0)


def test_no_wait_when_nobody_else_is_expected() -> None:
    # Everyone recently seen is already in the system (a lone client, say): waiting cannot fill
    # the batch.
    assert decide(q(1), 0.0, 8, (), 1.0, 0) == Dispatch(1)
    assert decide(q(1, 1), 0.0, 8, (), 1.0, 1) == Dispatch(0, 1.0)


def test_recent_peak_forgets_within_two_windows() -> None:
    peak = RecentPeak(1.0)
    peak.see(5, 0.0)
    peak.see(2, 0.5)
    assert peak.value(0.9) == 5
    assert peak.value(1.5) == 5  # the previous window still counts
    peak.see(1, 1.6)
    assert peak.value(2.1) == 5
    assert peak.value(2.6) == 1  # the window holding 5 is now two windows back
    assert peak.value(10.0) == 0
