"""Building the repository's sessions: on loader threads, by mcpd.serving.loads's rules (one
session building per model at most, only the last load asked for swaps in), each swapped in as it
ends or, when nobody wants it any more, released at once on a thread of its own and its memory
given back; an optimized version built in the background once the original serves; what the
loads say (failures, what a backend settled for) said once per message per minute at most.

Owned by the event loop, as the repository's entries it changes are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from mcpd.config import ModelSection
from mcpd.events import Event, EventBus
from mcpd.optimize.background import Optimizer
from mcpd.placement.plan import ModelPlacement
from mcpd.serving import backends
from mcpd.serving.backends import Backend
from mcpd.serving.codec import Interface
from mcpd.serving.entry import Entry
from mcpd.serving.errors import LoadError
from mcpd.serving.loads import Load, Target
from mcpd.serving.worker import ModelWorker, lower_priority
from sensors.episodes import Repeats

log = logging.getLogger("mcpd.serving")

REPEAT_INTERVAL_S = 60.0
"""A model's failure or warning repeated for the same reason (a client asking in a loop for the
load of a model) is said at most once per this, with the count of those unsaid: each failure said
is a log line and an event the governor spools for MQTT (15 549 spooled messages lost to such a
flood while the broker was down, the log +1.4 MB per 8 s, issue 26)."""


class Loader:
    def __init__(
        self,
        entries: Mapping[str, Entry],
        batch_size: Callable[[str], int],
        events: EventBus,
        limit: int,
        optimizer: Optimizer | None,
        open_backend: Callable[[ModelSection, ModelPlacement], Backend],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.entries = entries
        """The repository's: a session swaps in only while its entry is still there."""
        self.batch_size = batch_size
        self.events = events
        self.limit = limit
        self.optimizer = optimizer
        self.open_backend = open_backend
        """Builds a session; blocking, called on a loader thread."""
        self.clock = clock
        self._builder = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="model-load", initializer=lower_priority
        )
        # Releasing never waits behind a build: a session nobody wants is freed as it ends.
        self._releaser = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="model-release", initializer=lower_priority
        )
        self._builds: set[asyncio.Task[None]] = set()
        self._answers: dict[Load, asyncio.Future[str | None]] = {}
        """Per load not yet ended: what its requests wait for (why it failed, or None)."""
        self._optimizing: set[asyncio.Task[None]] = set()
        self._repeats: Repeats[str] = Repeats(REPEAT_INTERVAL_S)
        """What the loads said, by message."""

    @property
    def building(self) -> int:
        """Sessions being built (a replacement builds while the previous version serves)."""
        return len(self._builds)

    def want(self, entry: Entry, target: Target) -> tuple[Load, asyncio.Future[str | None]]:
        """Ask for a load of `target` (mcpd.serving.loads's rules); returns it and its answer."""
        entry.config, entry.file, entry.placement = target.model, target.file, target.placement
        load, start, overtaken = entry.loads.want(target)
        if overtaken is not None:
            self._answer(overtaken, None)
        if entry.worker is None:
            entry.state, entry.error = "loading", None
        answer = self._answers.get(load)
        if answer is None:
            answer = self._answers[load] = asyncio.get_running_loop().create_future()
        if start is not None:
            self._start(entry, start)
        return load, answer

    def drop(self, entry: Entry) -> None:
        """Nothing is wanted for `entry` any more (an unload, the model removed)."""
        overtaken = entry.loads.drop()
        if overtaken is not None:
            self._answer(overtaken, None)

    def _answer(self, load: Load, error: str | None) -> None:
        answer = self._answers.pop(load, None)
        if answer is not None and not answer.done():
            answer.set_result(error)

    def _start(self, entry: Entry, load: Load) -> None:
        task = asyncio.create_task(self._build(entry, load))
        self._builds.add(task)
        task.add_done_callback(self._builds.discard)

    async def _build(self, entry: Entry, load: Load) -> None:
        """Build `load`'s session; swap it in if it is still wanted when it ends, else release it
        at once; start the load that waited for it; answer its requests."""
        loop = asyncio.get_running_loop()
        name = load.target.model.name
        started = self.clock()
        error: str | None = None
        try:
            backend = await loop.run_in_executor(
                self._builder, self.open_backend, load.target.source(), load.target.placement
            )
        except Exception as exc:
            error = _reason(exc)
        else:
            for warning in backend.warnings:
                self._say(logging.WARNING, f"model {name}: {warning}")
        wanted, following = entry.loads.finished(load)
        if following is not None:
            self._start(entry, following)
        current = wanted and self.entries.get(name) is entry
        try:
            if error is not None:
                if current:
                    self._failed(entry, error)
            elif not current:
                self._say(
                    logging.INFO,
                    f"model {name}: a session built is released unused: a later load, unload "
                    "or reload overtook it",
                )
                await loop.run_in_executor(self._releaser, backends.release, backend)
            else:
                await self._swap_in(entry, load, backend, self.clock() - started)
        except Exception as exc:  # a thread that cannot start, a runtime that fails to close
            log.exception("model %s: the session built could not be swapped in", name)
            error = _reason(exc)
        finally:
            self._answer(load, error)  # never leave a request waiting

    async def _swap_in(self, entry: Entry, load: Load, backend: Backend, seconds: float) -> None:
        model, built = load.target.model, load.target.built
        worker = ModelWorker(
            model.name,
            backend,
            max_batch=model.max_batch,
            max_queue_size=model.max_queue_size,
            delay_s=model.max_queue_delay_ms / 1000,
            preferred=model.preferred_batch_sizes,
            batch_size=lambda: self.batch_size(model.name),
            loop=asyncio.get_running_loop(),
            statistics=entry.statistics,
            cpus=load.target.placement.allowed,
        )
        old, entry.worker = entry.worker, worker
        entry.interface = Interface(backend.inputs, backend.outputs, model.max_batch, self.limit)
        entry.state, entry.error = "ready", None
        entry.optimized = None if built is None else built.summary()
        detail = ", ".join(f"{k} {v}" for k, v in backend.detail.items())
        what = f"{backend.kind} ({detail}), batch 1..{model.max_batch}" + (
            f", fixed model batch {backend.fixed_batch}" if backend.fixed_batch else ""
        )
        if built is not None:
            what += f", optimized: {built.precision} ({built.runtime})" + (
                f" {built.speedup:.2f}x" if built.speedup else ""
            )
        verb = "reloaded" if old else "loaded"
        # The same model reloaded in a loop is said once a minute with a count, as a repeated
        # failure is (4 clients reloading the demo model: 130 log lines and events a second).
        unsaid = self._repeats.say(f"model {model.name} {verb}: {what}", self.clock())
        if unsaid is not None:
            message = _counted(f"model {model.name} {verb} in {seconds:.2f} s: {what}", unsaid)
            log.info("%s", message)
            self.events.publish(
                Event("model", message, {"model": model.name, "state": "ready", "unsaid": unsaid})
            )
        await self.retire(old)
        if built is None and model.optimize != "off" and self.optimizer is not None:
            self._optimize_later(entry, load.target, self.optimizer)

    def _optimize_later(self, entry: Entry, target: Target, optimizer: Optimizer) -> None:
        """Optimize what `target` loaded, unless that is being optimized already (a client
        loading the model in a loop must not start an optimizer process per load)."""
        if entry.optimizing is not None:
            running_for, running = entry.optimizing
            if running_for == target and not running.done():
                return
            running.cancel()  # it optimizes a file or table no longer wanted
        task = asyncio.create_task(self._optimize(entry, target, optimizer))
        entry.optimizing = (target, task)
        self._optimizing.add(task)
        task.add_done_callback(self._optimizing.discard)

    async def _optimize(self, entry: Entry, target: Target, optimizer: Optimizer) -> None:
        """Build (or take from the cache) the optimized model while the original serves; swap it
        in through the same path as a reload, if what serves is still what `target` loaded. A
        failure is an event; the original serves on."""
        name = target.model.name
        log.info("model %s: optimizing (%s) in the background", name, target.model.optimize)
        try:
            built = await optimizer.build(target.model)
        except Exception as exc:
            self._report_failure(
                f"model {name}: optimization failed, the original serves on: {exc}",
                {"model": name, "state": "optimize-failed"},
            )
            return
        if self.entries.get(name) is entry and entry.loads.serves(target):
            self.want(entry, dataclasses.replace(target, built=built))

    def _failed(self, entry: Entry, error: str) -> None:
        """The wanted load failed: the previous version, if any, serves on."""
        name = entry.config.name
        entry.error = error
        if entry.worker is None:
            entry.state = "failed"
            message = f"model {name} failed to load: {error}"
        else:
            message = f"model {name} reload failed, the previous version serves on: {error}"
        self._report_failure(message, {"model": name, "state": "failed"})

    def _report_failure(self, message: str, data: Mapping[str, object]) -> None:
        """Log and publish a failure (as _say says it)."""
        unsaid = self._say(logging.ERROR, message)
        if unsaid is not None:
            self.events.publish(
                Event("model", _counted(message, unsaid), {**data, "unsaid": unsaid})
            )

    def _say(self, level: int, message: str) -> int | None:
        """Log `message`, the same one at most once per REPEAT_INTERVAL_S with the count of
        those unsaid meanwhile; returns that count, or None when it stays unsaid."""
        unsaid = self._repeats.say(message, self.clock())
        if unsaid is not None:
            log.log(level, "%s", _counted(message, unsaid))
        return unsaid

    async def retire(self, worker: ModelWorker | None) -> None:
        if worker is not None:
            await asyncio.get_running_loop().run_in_executor(self._releaser, _release, worker)

    async def close(self, workers: list[ModelWorker]) -> None:
        """Stop building, release `workers` (finishing what they have queued)."""
        for task in [*self._builds, *self._optimizing]:
            task.cancel()
        for answer in self._answers.values():
            answer.cancel()
        await asyncio.gather(*(self.retire(worker) for worker in workers))
        self._builder.shutdown(wait=False, cancel_futures=True)
        self._releaser.shutdown(wait=False, cancel_futures=True)


def _counted(message: str, unsaid: int) -> str:
    return f"{message} ({unsaid} more times since this was last said)" if unsaid else message


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}"


def _release(worker: ModelWorker) -> None:
    """Drain and close a worker (blocking), and give its session's memory back."""
    worker.close()
    backends.trim_heap()
