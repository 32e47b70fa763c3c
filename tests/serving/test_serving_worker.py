"""A model's queue and batching thread, on real onnxruntime sessions. A gate around the real backend
holds a batch while the test queues more, so the batches formed are deterministic."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from mcpd.serving.errors import RequestError
from mcpd.serving.worker import INFERENCE_NICE
from tests.support.worker import load, one_batch_behind_another, rows, submit, until, worker


def test_requests_queued_behind_a_running_batch_become_one_batch(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        w = worker(backend)
        first, rest, results = await one_batch_behind_another(backend, w)
        assert backend.batches == [1, 6]  # the lone first request did not wait out the delay
        for pending, (double, total) in zip([first, *rest], results, strict=True):
            np.testing.assert_array_equal(double, pending.inputs[0] * 2)
            np.testing.assert_array_equal(total, pending.inputs[0].sum(axis=1))
        w.close()
        assert backend.closed

    asyncio.run(main())


def test_a_backend_that_runs_two_batches_at_once_has_two_in_flight(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        backend.parallel = 2  # as OpenVINO's, compiled to two streams
        w = worker(backend)
        first = submit(w, rows(1))
        assert await asyncio.to_thread(backend.entered.wait, 10)
        second = submit(w, rows(2, 10))
        await asyncio.wait_for(until(lambda: len(backend.batches) == 2), 10)  # beside the first
        third = submit(w, rows(3, 20))
        assert w.depth == 1  # both are busy: it waits for one of them
        backend.gate.set()
        results = await asyncio.gather(first.future, second.future, third.future)
        assert backend.batches == [1, 2, 3]
        for pending, (double, _) in zip([first, second, third], results, strict=True):
            np.testing.assert_array_equal(double, pending.inputs[0] * 2)
        w.close()
        assert backend.closed

    asyncio.run(main())


def test_with_two_batches_in_flight_each_takes_its_share_of_the_requests(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        backend.parallel = 2
        w = worker(backend)
        first = [submit(w, rows(1))]
        assert await asyncio.to_thread(backend.entered.wait, 10)
        first.append(submit(w, rows(1, 10)))
        await asyncio.wait_for(until(lambda: len(backend.batches) == 2), 10)
        queued = [submit(w, rows(1, 100 + 10 * n)) for n in range(6)]  # 8 in the system
        backend.gate.set()
        await asyncio.gather(*(p.future for p in first + queued))
        assert backend.batches[:2] == [1, 1]
        assert sorted(backend.batches[2:]) == [2, 4]  # not 6 on one stream, none on the other
        w.close()

    asyncio.run(main())


def test_governor_batch_size_caps_batches(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        size = [8]
        w = worker(backend, batch_size=lambda: size[0])
        first = submit(w, rows(1))
        assert await asyncio.to_thread(backend.entered.wait, 10)
        size[0] = 2
        rest = [submit(w, rows(1, i)) for i in range(5)]
        backend.gate.set()
        await asyncio.gather(first.future, *(p.future for p in rest))
        assert backend.batches == [1, 2, 2, 1]
        w.close()

    asyncio.run(main())


@pytest.mark.parametrize("fixed", [4, 1])
def test_fixed_batch_models_are_padded_or_run_one_at_a_time(tmp_path: Path, fixed: int) -> None:
    async def main() -> None:
        backend = load(tmp_path, batch=fixed)
        assert backend.fixed_batch == fixed
        backend.gate.set()
        w = worker(backend)
        pending = submit(w, rows(6))
        double, total = await pending.future
        np.testing.assert_array_equal(double, pending.inputs[0] * 2)
        assert total.shape == (6,)
        assert backend.batches == [fixed] * (6 // fixed + (6 % fixed > 0))
        w.close()

    asyncio.run(main())


def test_full_queue_refuses_at_once_and_cancel_frees_a_place(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        w = worker(backend, max_queue_size=2, batch_size=lambda: 1)
        running = submit(w, rows(1))
        assert await asyncio.to_thread(backend.entered.wait, 10)
        queued = [submit(w, rows(1)), submit(w, rows(1))]
        with pytest.raises(RequestError) as info:
            submit(w, rows(1))
        assert info.value.status == 503
        assert "queue is full (2 requests)" in info.value.message
        w.cancel(queued[0])  # the client went away
        assert w.depth == 1
        late = submit(w, rows(1))
        backend.gate.set()
        await asyncio.gather(running.future, queued[1].future, late.future)
        assert backend.batches == [1, 1, 1]  # the cancelled request never ran
        w.close()

    asyncio.run(main())


def test_requests_past_their_deadline_are_not_run(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        w = worker(backend, batch_size=lambda: 1)
        running = submit(w, rows(1))
        assert await asyncio.to_thread(backend.entered.wait, 10)
        stale = submit(w, rows(1), deadline=w.clock())
        backend.gate.set()
        await running.future
        with pytest.raises(RequestError, match=r"timed out after .* ms in the queue") as info:
            await stale.future
        assert info.value.status == 503
        assert backend.batches == [1]
        w.close()

    asyncio.run(main())


def test_a_failing_batch_fails_its_requests_only(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        backend.gate.set()
        w = worker(backend)
        wrong = submit(w, [np.zeros((1, 5), np.float32)])  # onnxruntime refuses the width
        with pytest.raises(RequestError) as info:
            await wrong.future
        assert info.value.status == 500
        assert "model 'm' failed" in info.value.message
        good = submit(w, rows(1))
        await good.future
        w.close()

    asyncio.run(main())


def test_close_finishes_the_queue_then_refuses(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        w = worker(backend, batch_size=lambda: 1)
        queued = [submit(w, rows(1)) for _ in range(3)]
        closing = asyncio.ensure_future(asyncio.to_thread(w.close))
        await asyncio.to_thread(backend.entered.wait, 10)
        backend.gate.set()
        await closing
        await asyncio.gather(*(p.future for p in queued))
        with pytest.raises(RequestError, match="being unloaded"):
            submit(w, rows(1))

    asyncio.run(main())


def test_inference_threads_yield_to_the_control_loop(tmp_path: Path) -> None:
    async def main() -> None:
        backend = load(tmp_path)
        backend.gate.set()
        w = worker(backend)
        await submit(w, rows(1)).future  # the thread has set its priority by now
        main_nice = os.getpriority(os.PRIO_PROCESS, os.getpid())
        thread = w._threads[0].native_id
        assert thread is not None
        assert os.getpriority(os.PRIO_PROCESS, thread) == min(19, main_nice + INFERENCE_NICE)
        w.close()

    asyncio.run(main())
