"""Per-model statistics as Triton counts them, and the latency histograms beside them: the
recorder's arithmetic, the worker's timings, and a served model's counts (warm-up excluded)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from mcpd.client import Client, ServerError
from mcpd.serving.statistics import Recorder, Timing
from mcpd.snapshot import LATENCY_BUCKETS_S, BatchStats, Duration, Histogram
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config
from tests.support.worker import load, one_batch_behind_another, worker


def test_the_recorder_counts_rows_batches_requests_and_their_times() -> None:
    recorder = Recorder(wall=lambda: 1700000000.25)
    assert recorder.snapshot().success == Duration() and recorder.snapshot().last_inference_ms == 0
    recorder.executed(3, input_ns=10, infer_ns=1_000_000, output_ns=20)
    recorder.executed(1, input_ns=5, infer_ns=400_000, output_ns=7)
    recorder.executed(3, input_ns=12, infer_ns=1_100_000, output_ns=30)
    batch = Timing(queue_ns=50_000, input_ns=10, infer_ns=1_000_000, output_ns=20)
    recorder.succeeded(1_200_000, batch)
    recorder.succeeded(1_300_000, batch)
    recorder.failed(90_000)
    got = recorder.snapshot()
    assert (got.inference_count, got.execution_count) == (7, 3)
    assert got.last_inference_ms == 1700000000250
    assert got.success == Duration(2, 2_500_000)
    assert got.fail == Duration(1, 90_000)
    assert got.queue == Duration(2, 100_000)
    assert (got.compute_input, got.compute_infer, got.compute_output) == (
        Duration(2, 20), Duration(2, 2_000_000), Duration(2, 40),
    )  # fmt: skip
    assert got.batches == (
        BatchStats(1, Duration(1, 5), Duration(1, 400_000), Duration(1, 7)),
        BatchStats(3, Duration(2, 22), Duration(2, 2_100_000), Duration(2, 50)),
    )
    # Histograms of successful requests only, cumulative, seconds.
    assert got.request_latency.count == 2 and got.queue_latency.count == 2
    assert got.request_latency.sum_s == 0.0025


def test_histogram_buckets_are_cumulative_with_inclusive_upper_bounds() -> None:
    recorder = Recorder()
    for queue_ns in (100_000, 150_000, 200_001, 2_000_000_000):
        recorder.succeeded(queue_ns, Timing(queue_ns, 0, 0, 0))
    queue = recorder.snapshot().queue_latency
    assert LATENCY_BUCKETS_S[:3] == (0.0001, 0.0002, 0.0004)
    assert LATENCY_BUCKETS_S[-1] == 0.0001 * 2**13  # 819.2 ms; more is +Inf only
    assert queue.buckets[:3] == (1, 2, 3)  # 100 µs is in "le 0.0001"; 200.001 µs in "le 0.0004"
    assert queue.buckets[-2:] == (3, 4)  # 2 s only in +Inf
    assert len(queue.buckets) == len(LATENCY_BUCKETS_S) + 1 == len(Histogram().buckets)
    assert queue.sum_s == 2.000450001


def test_requests_batched_together_share_their_batch_times(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        w = worker(backend)
        first, rest, _ = await one_batch_behind_another(backend, w)
        w.close()
        assert backend.batches == [1, 6]
        got = w.statistics.snapshot()
        assert (got.inference_count, got.execution_count) == (7, 2)
        assert [b.batch_size for b in got.batches] == [1, 6]
        six = got.batches[1]
        timings = [p.timing for p in rest]
        assert all(t is not None for t in timings)
        assert {(t.input_ns, t.infer_ns, t.output_ns) for t in timings if t} == {
            (six.compute_input.ns, six.compute_infer.ns, six.compute_output.ns)
        }
        # They waited in the queue while the first batch held the model.
        first_timing = first.timing
        assert first_timing is not None
        assert all(t and t.queue_ns > 0 for t in timings)
        assert got.batches[0].compute_infer == Duration(1, first_timing.infer_ns)

    asyncio.run(main())


def test_a_served_model_counts_rows_requests_and_failures_but_not_its_warm_up(
    tmp_path: Path,
) -> None:
    served = Served(config(tmp_path, [{"name": "m", "path": str(scale(tmp_path / "m.onnx"))}]))
    try:
        served.wait_settled()
        # onnxruntime's warm-up run at load went through the model, not through the statistics.
        stats = served.service.stats()["m"]
        assert stats.statistics is not None
        assert stats.statistics.execution_count == 0 and stats.statistics.inference_count == 0
        with Client(served.socket, timeout=30) as client:
            client.infer("m", {"x": np.ones((3, 4), np.float32)})
            client.infer("m", {"x": np.ones((1, 4), np.float32)})
            with pytest.raises(ServerError, match="expected"):
                client.infer("m", {"x": np.ones((1, 5), np.float32)})
        stats = served.service.stats()["m"]
        got = stats.statistics
        assert got is not None
        assert (got.inference_count, got.execution_count) == (4, 2)
        assert (got.success.count, got.fail.count) == (2, 1)
        assert (stats.requests, stats.errors) == (3, 1)
        assert [(b.batch_size, b.compute_infer.count) for b in got.batches] == [(1, 1), (3, 1)]
        assert got.success.ns >= got.queue.ns + got.compute_infer.ns > 0
        assert got.last_inference_ms > 0
        assert got.request_latency.count == 2 and got.compute_latency.count == 2
    finally:
        served.close()
