"""The throughput–latency Pareto frontier: the points no other point beats on both latency (lower)
and throughput (higher). One sort, then one pass (the reference design's script compared every
pair)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    label: str  # what was measured, e.g. "int8 batch 4 threads 2"
    latency_ms: float  # p50 of one batch
    throughput: float  # items per second


def frontier(points: Sequence[Point]) -> list[Point]:
    """The Pareto-optimal points, fastest first. Sorted by latency (ties: higher throughput
    first), a point is on the frontier exactly when its throughput beats every point before it."""
    ordered = sorted(points, key=lambda p: (p.latency_ms, -p.throughput))
    best = float("-inf")
    optimal = []
    for point in ordered:
        if point.throughput > best:
            optimal.append(point)
            best = point.throughput
    return optimal
