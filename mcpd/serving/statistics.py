"""One model's statistics recorder: Triton's statistics extension counts and the latency histograms
(mcpd.snapshot.Statistics says what each field counts), kept once for both the `/stats` endpoints and
Prometheus.

The model's worker threads record each batch they run (`executed`) and hand every request in it its
timing; the event loop records each request's outcome (`succeeded`, `failed`). A lock keeps the two
apart; each record is a few additions, so neither waits on the other in earnest.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mcpd.snapshot import LATENCY_BUCKETS_S, BatchStats, Duration, Histogram, Statistics


@dataclass(frozen=True)
class Timing:
    """What one request spent in the worker, in ns: in its model's queue, then its batch's
    compute_input, compute_infer and compute_output."""

    queue_ns: int
    input_ns: int
    infer_ns: int
    output_ns: int

    @property
    def compute_ns(self) -> int:
        return self.input_ns + self.infer_ns + self.output_ns


class _Total:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def frozen(self) -> Duration:
        return Duration(self.count, self.ns)


class _Buckets:
    """Observations per bucket (not cumulative: that is done once, when read)."""

    __slots__ = ("counts", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum_ns = 0  # whole ns: a float sum would drift

    def observe(self, ns: int) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, ns / 1e9)] += 1
        self.sum_ns += ns

    def frozen(self) -> Histogram:
        return Histogram(tuple(itertools.accumulate(self.counts)), self.sum_ns / 1e9)


class Recorder:
    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.wall = wall
        self._lock = threading.Lock()
        self._inferences = 0
        self._executions = 0
        self._last_ms = 0
        self._success, self._fail, self._queue = _Total(), _Total(), _Total()
        self._input, self._infer, self._output = _Total(), _Total(), _Total()
        self._batches: dict[int, tuple[_Total, _Total, _Total]] = {}
        self._request_hist, self._queue_hist, self._compute_hist = (
            _Buckets(),
            _Buckets(),
            _Buckets(),
        )

    def executed(self, rows: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """A batch of `rows` ran (the worker thread)."""
        with self._lock:
            self._inferences += rows
            self._executions += 1
            totals = self._batches.get(rows)
            if totals is None:
                totals = self._batches[rows] = (_Total(), _Total(), _Total())
            for total, ns in zip(totals, (input_ns, infer_ns, output_ns), strict=True):
                total.add(ns)

    def succeeded(self, request_ns: int, timing: Timing) -> None:
        """A request was answered `request_ns` after it arrived (the event loop)."""
        with self._lock:
            self._last_ms = int(self.wall() * 1000)
            self._success.add(request_ns)
            self._queue.add(timing.queue_ns)
            self._input.add(timing.input_ns)
            self._infer.add(timing.infer_ns)
            self._output.add(timing.output_ns)
            self._request_hist.observe(request_ns)
            self._queue_hist.observe(timing.queue_ns)
            self._compute_hist.observe(timing.compute_ns)

    def failed(self, request_ns: int) -> None:
        with self._lock:
            self._fail.add(request_ns)

    def snapshot(self) -> Statistics:
        with self._lock:
            return Statistics(
                inference_count=self._inferences,
                execution_count=self._executions,
                last_inference_ms=self._last_ms,
                success=self._success.frozen(),
                fail=self._fail.frozen(),
                queue=self._queue.frozen(),
                compute_input=self._input.frozen(),
                compute_infer=self._infer.frozen(),
                compute_output=self._output.frozen(),
                batches=tuple(
                    BatchStats(size, *(total.frozen() for total in totals))
                    for size, totals in sorted(self._batches.items())
                ),
                request_latency=self._request_hist.frozen(),
                queue_latency=self._queue_hist.frozen(),
                compute_latency=self._compute_hist.frozen(),
            )
