"""One model's queue and the threads that batch it and run the backend.

The event loop only appends to the queue (under a lock held for microseconds) and later receives the
results through call_soon_threadsafe; forming batches, waiting out the queue delay, concatenating,
running the model and slicing results all happen on the model's threads, so neither the HTTP server
nor the control loop ever waits for a model. One batch is in flight per model, or one per batch the
backend runs at once (`Backend.parallel`: OpenVINO's streams), each on a thread of its own: while
they run, the next one fills, which is what makes batching pay on a busy model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from mcpd.placement import affinity
from mcpd.serving.backends import Backend
from mcpd.serving.batching import Queued, RecentPeak, decide
from mcpd.serving.errors import RequestError
from mcpd.serving.statistics import Recorder, Timing

log = logging.getLogger("mcpd.serving")

PEAK_WINDOW_S = 1.0
"""How far back the recent peak of requests in the system reaches (see batching.decide)."""
INFERENCE_NICE = 5
"""How much nicer than the serving process's main thread inference threads run (lower_priority)."""


def lower_priority() -> None:
    """Make the calling thread nicer than the serving process's main thread, and with it the
    threads it creates (onnxruntime's intra-op pool is created by the thread that loads the
    session). A model saturating every core then still yields the CPU at once to the HTTP server,
    which runs at the process's own priority (the governor is another process)."""
    main = os.getpriority(os.PRIO_PROCESS, os.getpid())
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, main + INFERENCE_NICE))


Outputs = list[np.ndarray]


class Pending:
    """A decoded request waiting for its batch. Owned by the event loop until queued."""

    __slots__ = (
        "arrived", "cancelled", "deadline", "future", "inputs", "key", "queued", "rows", "timing",
    )  # fmt: skip

    def __init__(
        self,
        inputs: Sequence[np.ndarray],
        future: asyncio.Future[Outputs],
        arrived: float,
        deadline: float | None,
    ) -> None:
        self.inputs = inputs
        self.rows = int(inputs[0].shape[0])
        self.key: Hashable = tuple(array.shape[1:] for array in inputs)
        self.future = future
        self.arrived = arrived
        self.deadline = deadline
        self.cancelled = False
        self.queued = arrived
        """When it entered the queue (the worker's clock)."""
        self.timing: Timing | None = None
        """Set by the worker with the answer."""


def run_batch(backend: Backend, inputs: Sequence[np.ndarray], rows: int) -> Outputs:
    """Run `rows` rows, in pieces of the model's fixed batch size where it has one (the last piece
    padded with zeros and its padding dropped), so a fixed-batch model serves any request."""
    fixed = backend.fixed_batch
    if fixed is None or fixed == rows:
        outputs = backend.run(inputs)
    else:
        pieces = []
        for start in range(0, rows, fixed):
            part = [array[start : start + fixed] for array in inputs]
            size = part[0].shape[0]
            if size < fixed:
                part = [_pad(array, fixed) for array in part]
            pieces.append([output[:size] for output in backend.run(part)])
        outputs = (
            pieces[0]
            if len(pieces) == 1
            else [np.concatenate(o) for o in zip(*pieces, strict=True)]
        )
    for spec, output in zip(backend.outputs, outputs, strict=False):
        if output.ndim == 0 or output.shape[0] != rows:
            raise RuntimeError(
                f"output {spec.name!r} has shape {list(output.shape)} for a batch of {rows}"
            )
    return outputs


def _pad(array: np.ndarray, rows: int) -> np.ndarray:
    padding = np.zeros((rows - array.shape[0], *array.shape[1:]), array.dtype)
    return np.concatenate([array, padding])


class ModelWorker:
    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        max_batch: int,
        max_queue_size: int,
        delay_s: float,
        preferred: Sequence[int],
        batch_size: Callable[[], int],
        loop: asyncio.AbstractEventLoop,
        statistics: Recorder | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpus: Sequence[int] = (),
    ) -> None:
        """`cpus`: where the worker's threads run, the model's CPUs (they run each batch, and
        onnxruntime gives the caller a share of each parallel section, OpenVINO a stream of one
        thread all of it)."""
        self.name = name
        self.cpus = tuple(cpus)
        self.backend = backend
        self.max_batch = max_batch
        self.max_queue_size = max_queue_size
        self.delay_s = delay_s
        self.preferred = frozenset(preferred)
        self.batch_size = batch_size
        self.loop = loop
        self.clock = clock
        self.statistics = Recorder() if statistics is None else statistics
        self._queue: deque[Pending] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closing = False
        self._in_system = 0
        """Rows queued or running."""
        self._peak = RecentPeak(PEAK_WINDOW_S)
        self._threads = [
            threading.Thread(target=self._run, name=f"model-{name}", daemon=True)
            for _ in range(backend.parallel)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def depth(self) -> int:
        return len(self._queue)

    def submit(self, pending: Pending) -> None:
        with self._cond:
            if self._closing:
                raise RequestError(f"model {self.name!r} is being unloaded", 503)
            if len(self._queue) >= self.max_queue_size:
                raise RequestError(
                    f"model {self.name!r} queue is full ({self.max_queue_size} requests); "
                    "retry later",
                    503,
                )
            pending.queued = self.clock()
            self._queue.append(pending)
            self._in_system += pending.rows
            self._peak.see(self._in_system, self.clock())
            self._cond.notify()

    def cancel(self, pending: Pending) -> None:
        """The client went away or timed out: drop the request unless it is already running."""
        pending.cancelled = True
        with self._cond, contextlib.suppress(ValueError):  # already taken into a batch
            self._queue.remove(pending)
            self._in_system -= pending.rows

    def close(self) -> None:
        """Stop taking requests, finish the queued ones, release the model. Blocks: run it in a
        thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        self.backend.close()

    # -- the worker's threads --------------------------------------------------------------------

    def _run(self) -> None:
        lower_priority()
        if self.cpus:
            affinity.pin(self.cpus, f"model {self.name}'s worker")
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._execute(batch)

    def _next_batch(self) -> list[Pending] | None:
        with self._cond:
            while True:
                now = self.clock()
                self._expire(now)
                if self._closing and not self._queue:
                    return None
                peak = self._peak.value(now)
                # With several batches in flight, each takes its share of the rows in the system
                # at their recent peak: the first thread free would otherwise take everything
                # queued, leaving the others a request at a time, and their streams working on
                # batches of one (bf16 ResNet-50 at 8 connections, 2 streams: 269 of 516 batches
                # of one row). One thread's share is all there is (a peak is never below the rows
                # now in the system, even one forgotten while a long batch ran).
                share = -(-max(peak, self._in_system) // len(self._threads))
                limit = max(1, min(self.max_batch, self.batch_size(), share))
                queued = [Queued(p.rows, p.key, p.arrived) for p in self._queue]
                delay = 0.0 if self._closing else self.delay_s
                expected = peak - self._in_system
                decision = decide(queued, now, limit, self.preferred, delay, expected)
                if decision.take:
                    return [self._queue.popleft() for _ in range(decision.take)]
                timeout = None if decision.wait_until is None else decision.wait_until - now
                self._cond.wait(timeout)

    def _expire(self, now: float) -> None:
        expired = [p for p in self._queue if p.deadline is not None and p.deadline <= now]
        for pending in expired:
            self._queue.remove(pending)
            self._in_system -= pending.rows
            waited_ms = (now - pending.arrived) * 1000
            error = RequestError(
                f"request to model {self.name!r} timed out after {waited_ms:.0f} ms in the queue",
                503,
            )
            self._post(_fail, [pending], error)

    def _execute(self, batch: list[Pending]) -> None:
        started = self.clock()
        rows = sum(p.rows for p in batch)
        try:
            if len(batch) == 1:
                inputs = batch[0].inputs
            else:
                inputs = [
                    np.concatenate(parts) for parts in zip(*(p.inputs for p in batch), strict=True)
                ]
            joined = self.clock()
            outputs = run_batch(self.backend, inputs, rows)
        except Exception as exc:
            log.exception("model %s failed on a batch of %d", self.name, rows)
            self._finished(rows)
            self._post(_fail, batch, RequestError(f"model {self.name!r} failed: {exc}", 500))
            return
        ran = self.clock()
        results = []
        start = 0
        for pending in batch:
            results.append([output[start : start + pending.rows] for output in outputs])
            start += pending.rows
        split = self.clock()
        compute = (_ns(joined - started), _ns(ran - joined), _ns(split - ran))
        for pending in batch:
            pending.timing = Timing(_ns(started - pending.queued), *compute)
        self.statistics.executed(rows, *compute)
        self._finished(rows)
        self._post(_deliver, batch, results)

    def _finished(self, rows: int) -> None:
        # Before the answers go out: a client's next request must not count this one as still
        # in the system, or a lone client would look like two and wait for a partner.
        with self._cond:
            self._in_system -= rows

    def _post(self, callback: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(callback, *args)


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def _deliver(batch: list[Pending], results: list[Outputs]) -> None:
    for pending, outputs in zip(batch, results, strict=True):
        if not pending.future.done():
            pending.future.set_result(outputs)


def _fail(batch: list[Pending], error: RequestError) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)
