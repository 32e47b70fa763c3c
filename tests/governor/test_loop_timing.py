"""The loop's timing figures and request latencies: percentiles in constant memory."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpd.governor.timing import LoopTiming
from mcpd.percentiles import Durations


@given(st.lists(st.floats(min_value=0.0, max_value=30.0), min_size=1, max_size=2000))
def test_quantiles_are_within_two_percent_of_the_exact_ones(values: list[float]) -> None:
    durations = Durations()
    for value in values:
        durations.append(value)
    ordered = sorted(values)
    for q in (0.5, 0.99, 1.0):
        exact = ordered[max(1, math.ceil(q * len(ordered))) - 1]
        assert durations.quantile(q) == pytest.approx(exact, rel=0.021, abs=1.1e-6)
    assert durations.max_s == max(values) and len(durations) == len(values)


def test_the_whole_run_counts_not_only_its_last_samples() -> None:
    """Start-up counts: a slow first second stays in the p99 however long the run is."""
    timing = LoopTiming()
    rng = random.Random(1)
    for _ in range(300):
        timing.lateness_s.append(0.050)  # a slow start: 1.5 % of the run
    for _ in range(20_000):  # more than any window the figures used to keep
        timing.lateness_s.append(rng.uniform(0.0001, 0.0003))
    summary = timing.summary()["sample_lateness"]
    assert summary is not None
    assert summary["max_ms"] == 50.0 and summary["count"] == 20_300
    assert summary["p99_ms"] == pytest.approx(50.0, rel=0.02)
    assert summary["p50_ms"] < 0.31
    timing.lateness_s.clear()
    assert timing.summary()["sample_lateness"] is None


def test_a_window_follows_the_last_samples_only() -> None:
    """Request latencies: a slow spell is forgotten once `window` faster requests followed it."""
    latencies = Durations(window=100)
    for _ in range(100):
        latencies.append(0.050)
    assert latencies.quantile(0.5) == pytest.approx(0.050, rel=0.02)
    for _ in range(100):
        latencies.append(0.001)
    assert len(latencies) == 100
    assert latencies.quantile(0.99) == pytest.approx(0.001, rel=0.02)
    assert latencies.max_s == 0.050  # the maximum stays the whole run's
