"""The loop's timing figures: percentiles of the whole run, in constant memory."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpd.timing import Durations, LoopTiming


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
