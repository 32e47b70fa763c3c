"""A model worker on a real backend whose batches wait at a gate the test opens: what runs
together, in which order, and what queues meanwhile."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mcpd.config import ModelSection
from mcpd.serving import backends
from mcpd.serving.worker import ModelWorker, Pending
from tests.support.serving_models import scale


class Gated:
    """The real backend, but each batch waits for the gate and is recorded."""

    def __init__(self, backend: backends.Backend) -> None:
        self.backend = backend
        self.parallel = backend.parallel
        """How many batches the worker keeps in flight: a test may raise it."""
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[int] = []
        self.closed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.batches.append(inputs[0].shape[0])
        self.entered.set()
        assert self.gate.wait(10)
        return self.backend.run(inputs)

    def close(self) -> None:
        self.closed = True
        self.backend.close()


def load(tmp_path: Path, batch: int | str = "N") -> Gated:
    path = scale(tmp_path / f"scale{batch}.onnx", batch=batch)
    return Gated(backends.load(ModelSection(name="m", path=str(path))))


def rows(n: int, start: float = 0.0) -> list[np.ndarray]:
    return [np.arange(start, start + 4 * n, dtype=np.float32).reshape(n, 4)]


async def until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0)  # let the worker thread's callbacks in


def worker(backend: Gated, **kw: Any) -> ModelWorker:
    options: dict[str, Any] = dict(
        max_batch=8, max_queue_size=16, delay_s=0.01, preferred=(), batch_size=lambda: 8
    )
    options.update(kw)
    return ModelWorker("m", backend, loop=asyncio.get_running_loop(), **options)


def submit(w: ModelWorker, inputs: list[np.ndarray], deadline: float | None = None) -> Pending:
    future = asyncio.get_running_loop().create_future()
    pending = Pending(inputs, future, w.clock(), deadline)
    w.submit(pending)
    return pending


async def one_batch_behind_another(
    backend: Gated, w: ModelWorker
) -> tuple[Pending, list[Pending], list[Any]]:
    """One request of 1 row holds the model while three more (1, 2 and 3 rows) queue; then the
    model is let go: the first request, the three, and every answer in that order."""
    first = submit(w, rows(1))
    assert await asyncio.to_thread(backend.entered.wait, 10)
    rest = [submit(w, rows(n, 100 * n)) for n in (1, 2, 3)]
    backend.gate.set()
    results = await asyncio.gather(first.future, *(p.future for p in rest))
    return first, rest, results
