"""The models being served: loading in the background, failures reported, reloads that add,
remove or replace models while the others keep serving, and Triton's load and unload requests
(docs/serving-protocol.md §2.3).

Owned by the event loop. Loading (seconds for a big model) runs on a loader thread; a replacement
keeps the running version serving until the new one is ready, then swaps it in and drains the old
one, so no request is dropped. A replacement that fails to load leaves the old version serving and
says so. Each load is numbered (`Entry.generation`): only the newest one asked for may swap in, so a
slow load that finishes after a later one, or after an unload, is discarded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mcpd.config import ModelSection
from mcpd.events import Event, EventBus
from mcpd.optimize.background import Built, Optimizer
from mcpd.percentiles import Durations
from mcpd.serving import backends
from mcpd.serving.codec import VERSION, Interface
from mcpd.serving.errors import LoadError, RequestError
from mcpd.serving.statistics import Recorder
from mcpd.serving.worker import ModelWorker, lower_priority
from mcpd.snapshot import ModelStats

log = logging.getLogger("mcpd.serving")

LATENCY_WINDOW = 2048
"""The status's request latency percentiles are over this many last requests."""


@dataclass
class Entry:
    config: ModelSection
    """The configuration wanted now (a load of it may still be running)."""
    file: tuple[int, ...] | None = None
    """The model file's identity when that load was asked for (see `_file_identity`)."""
    state: str = "loading"
    """loading, ready, failed or unloaded (by a client's unload request)."""
    generation: int = 0
    """Bumped by every load asked for and every unload; a load swaps in only if still current."""
    worker: ModelWorker | None = None
    interface: Interface | None = None
    error: str | None = None
    statistics: Recorder = field(default_factory=Recorder)
    """Kept across reloads of the model: its counts since it was first configured."""
    latencies: Durations = field(default_factory=lambda: Durations(window=LATENCY_WINDOW))
    """Request latencies, appended on the event loop, read from anywhere."""
    optimized: dict[str, object] | None = None
    """What serves when `optimize` is on: precision, speedup and accuracy of the swapped-in model."""


class Repository:
    def __init__(
        self,
        batch_size: Callable[[str], int],
        events: EventBus,
        limit: int,
        optimizer: Optimizer | None = None,
        *,
        open_backend: Callable[[ModelSection], backends.Backend] = backends.load,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batch_size = batch_size
        self.events = events
        self.limit = limit
        self.optimizer = optimizer
        self.open_backend = open_backend
        """Builds a session; blocking, called on a loader thread."""
        self.clock = clock
        self.entries: dict[str, Entry] = {}
        self._loader = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="model-load", initializer=lower_priority
        )
        self._tasks: set[asyncio.Task[str | None]] = set()
        self._optimizing: set[asyncio.Task[None]] = set()

    # -- reads (the HTTP handlers) ---------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> Entry:
        entry = self.entries.get(name)
        if entry is None:
            raise RequestError(f"unknown model {name!r}", 404)
        if version is not None and version != VERSION:
            raise RequestError(f"model {name!r} has no version {version!r} (only {VERSION})", 404)
        return entry

    def serving(self, name: str, version: str | None = None) -> tuple[Entry, ModelWorker]:
        entry = self.get(name, version)
        if entry.worker is None:
            if entry.state == "unloaded":
                # Triton: NOT_FOUND "has no available versions", or UNAVAILABLE when the request
                # names the version (docs/serving-protocol.md §2.3).
                raise RequestError(
                    f"model {name!r} is unloaded; POST /v2/repository/models/{name}/load loads it",
                    404 if version is None else 503,
                )
            why = f"failed to load: {entry.error}" if entry.state == "failed" else "still loading"
            raise RequestError(f"model {name!r} is not ready: {why}", 503)
        return entry, entry.worker

    @property
    def loading(self) -> int:
        """Loads still running (a replacement loads while the previous version serves)."""
        return len(self._tasks)

    @property
    def all_ready(self) -> bool:
        """Every model serves but those a client unloaded (Triton counts only the models it was
        asked to load)."""
        return all(
            entry.worker is not None or entry.state == "unloaded" for entry in self.entries.values()
        )

    def stats(self) -> dict[str, ModelStats]:
        return {name: _stats(entry) for name, entry in self.entries.items()}

    # -- changes ---------------------------------------------------------------------------------

    async def apply(self, models: tuple[ModelSection, ...]) -> None:
        """Make the served set match `models`. Returns once unloads are done; loads go on in the
        background."""
        wanted = {model.name: model for model in models}
        for name in [name for name in self.entries if name not in wanted]:
            removed = self.entries.pop(name)
            log.info("model %s removed from the configuration; unloading", name)
            await self._retire(removed.worker)
            self.events.publish(Event("model", f"model {name} unloaded", {"model": name}))
        for name, model in wanted.items():
            entry = self.entries.get(name)
            file = _file_identity(model.path)
            if entry is not None and entry.config == model and entry.file == file:
                continue
            if entry is None:
                entry = self.entries[name] = Entry(model, file)
            elif entry.state == "unloaded":  # stays unloaded until a client loads it
                entry.config, entry.file = model, file
                continue
            self._start_load(entry, model, file)

    def _start_load(
        self, entry: Entry, model: ModelSection, file: tuple[int, ...] | None
    ) -> asyncio.Task[str | None]:
        entry.config, entry.file = model, file
        entry.generation += 1
        if entry.worker is None:
            entry.state, entry.error = "loading", None
        task = asyncio.create_task(self._load(model, entry.generation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def load(self, name: str) -> None:
        """A client's load request: read the configured model's file again and swap it in, like a
        reload of a replaced file; returns once it serves. A load that fails leaves the previous
        version (if any) serving and raises a 400 naming the file and the reason (Triton answers a
        failed load with INVALID_ARG)."""
        entry = self.get(name)
        model = entry.config
        task = self._start_load(entry, model, _file_identity(model.path))
        generation = entry.generation
        # Shielded: a client that hangs up does not cancel a load that others may be waiting for.
        error = await asyncio.shield(task)
        if error is not None:
            serving = "the previous version serves on" if entry.worker else "it does not serve"
            raise RequestError(f"model {name!r}: loading {model.path} failed ({serving}): {error}")
        if self.entries.get(name) is not entry or entry.generation != generation:
            raise RequestError(f"model {name!r}: a later reload, load or unload overtook this load")

    async def unload(self, name: str) -> None:
        """A client's unload request: stop taking requests for the model, finish those it already
        took, release it. It stays unloaded (through config reloads too) until a load request."""
        entry = self.get(name)
        old, entry.worker, entry.interface = entry.worker, None, None
        entry.generation += 1  # a load still running is discarded when it finishes
        entry.state, entry.error = "unloaded", None
        log.info("model %s unloaded on request", name)
        self.events.publish(
            Event(
                "model", f"model {name} unloaded on request", {"model": name, "state": "unloaded"}
            )
        )
        await self._retire(old)

    async def _load(
        self, model: ModelSection, generation: int, built: Built | None = None
    ) -> str | None:
        """Load `model` (or, with `built`, its optimized file) and swap it in if no later load or
        unload was asked for meanwhile. Returns why it failed, or None."""
        loop = asyncio.get_running_loop()
        started = self.clock()
        # The optimized file replaces the path; a saved graph of the original must not stand in.
        source = (
            model
            if built is None
            else dataclasses.replace(
                model,
                path=str(built.path),
                onnxruntime=dataclasses.replace(model.onnxruntime, optimized_model_path=""),
            )
        )
        try:
            backend = await loop.run_in_executor(self._loader, self.open_backend, source)
        except Exception as exc:
            return self._failed(model, generation, exc)
        entry = self.entries.get(model.name)
        if entry is None or entry.generation != generation:  # removed, changed, or unloaded
            await loop.run_in_executor(self._loader, backend.close)
            return None
        worker = ModelWorker(
            model.name,
            backend,
            max_batch=model.max_batch,
            max_queue_size=model.max_queue_size,
            delay_s=model.max_queue_delay_ms / 1000,
            preferred=model.preferred_batch_sizes,
            batch_size=lambda: self.batch_size(model.name),
            loop=loop,
            statistics=entry.statistics,
        )
        old, entry.worker = entry.worker, worker
        entry.interface = Interface(backend.inputs, backend.outputs, model.max_batch, self.limit)
        entry.state, entry.error = "ready", None
        entry.optimized = None if built is None else built.summary()
        detail = ", ".join(f"{k} {v}" for k, v in backend.detail.items())
        message = (
            f"model {model.name} {'reloaded' if old else 'loaded'} in "
            f"{self.clock() - started:.2f} s: {backend.kind} ({detail}), "
            f"batch 1..{model.max_batch}"
            + (f", fixed model batch {backend.fixed_batch}" if backend.fixed_batch else "")
        )
        if built is not None:
            message += f", optimized: {built.precision}" + (
                f" {built.speedup:.2f}x" if built.speedup else ""
            )
        log.info("%s", message)
        self.events.publish(Event("model", message, {"model": model.name, "state": "ready"}))
        await self._retire(old)
        if built is None and model.optimize != "off" and self.optimizer is not None:
            task = asyncio.create_task(self._optimize(model, generation, self.optimizer))
            self._optimizing.add(task)
            task.add_done_callback(self._optimizing.discard)
        return None

    async def _optimize(self, model: ModelSection, generation: int, optimizer: Optimizer) -> None:
        """Build (or take from the cache) the optimized model while the original serves; swap it
        in through the same path as a reload. A failure is an event; the original serves on."""
        log.info("model %s: optimizing (%s) in the background", model.name, model.optimize)
        try:
            built = await optimizer.build(model)
        except Exception as exc:
            message = f"model {model.name}: optimization failed, the original serves on: {exc}"
            log.error("%s", message)
            self.events.publish(
                Event("model", message, {"model": model.name, "state": "optimize-failed"})
            )
            return
        entry = self.entries.get(model.name)
        if entry is not None and entry.generation == generation:
            await self._load(model, generation, built)

    def _failed(self, model: ModelSection, generation: int, exc: Exception) -> str:
        error = str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}"
        entry = self.entries.get(model.name)
        if entry is None or entry.generation != generation:
            return error
        entry.error = error
        if entry.worker is None:
            entry.state = "failed"
            message = f"model {model.name} failed to load: {error}"
        else:
            message = f"model {model.name} reload failed, the previous version serves on: {error}"
        log.error("%s", message)
        self.events.publish(Event("model", message, {"model": model.name, "state": "failed"}))
        return error

    async def _retire(self, worker: ModelWorker | None) -> None:
        if worker is not None:
            await asyncio.get_running_loop().run_in_executor(self._loader, worker.close)

    async def close(self) -> None:
        """Finish what is queued, release every model."""
        for task in [*self._tasks, *self._optimizing]:
            task.cancel()
        entries, self.entries = self.entries, {}
        await asyncio.gather(*(self._retire(entry.worker) for entry in entries.values()))
        self._loader.shutdown(wait=False, cancel_futures=True)


def _file_identity(path: str) -> tuple[int, ...] | None:
    """Which file `path` names now: a file replaced by rename (a new inode) or rewritten in place
    (size, times) is a new model even when its [[models]] table is unchanged."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def _stats(entry: Entry) -> ModelStats:
    latencies = entry.latencies
    p50 = p99 = None
    if len(latencies):
        p50, p99 = latencies.quantile(0.5) * 1000, latencies.quantile(0.99) * 1000
    statistics = entry.statistics.snapshot()
    runs = statistics.execution_count
    busy_ns = sum(
        b.compute_input.ns + b.compute_infer.ns + b.compute_output.ns for b in statistics.batches
    )
    worker = entry.worker
    detail: dict[str, object] = {"state": entry.state, "path": entry.config.path}
    if entry.error:
        detail["error"] = entry.error
    if entry.optimized is not None:
        detail["optimized"] = entry.optimized
    if worker is not None:
        backend = worker.backend
        detail.update(backend=backend.kind, fixed_batch=backend.fixed_batch, **backend.detail)
        detail.update(
            batches=runs,
            avg_batch=round(statistics.inference_count / runs, 2) if runs else None,
            busy_s=round(busy_ns / 1e9, 3),
        )
    return ModelStats(
        ready=worker is not None,
        requests=statistics.success.count + statistics.fail.count,
        errors=statistics.fail.count,
        p50_ms=p50,
        p99_ms=p99,
        queue_depth=worker.depth if worker is not None else 0,
        detail=detail,
        statistics=statistics,
    )
