"""The models being served: loading in the background, failures reported, reloads that add,
remove or replace models while the others keep serving, and Triton's load and unload requests
(docs/serving-protocol.md §2.3).

Owned by the event loop. Loading (seconds for a big model) runs on a loader thread
(mcpd.serving.loader); a replacement keeps the running version serving until the new one is ready,
then swaps it in and drains the old one, so no request is dropped. A replacement that fails to load
leaves the old version serving and says so. A load of what is being built joins that build, and
only the last load asked for swaps in (mcpd.serving.loads): a slow load that finishes after a later
one, or after an unload, is released unused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from mcpd.config import ModelSection
from mcpd.events import Event, EventBus
from mcpd.optimize.background import Optimizer
from mcpd.placement.plan import UNPLACED, ModelPlacement
from mcpd.serving import backends
from mcpd.serving.backends import Backend
from mcpd.serving.codec import VERSION
from mcpd.serving.entry import Entry, file_identity
from mcpd.serving.entry import stats as entry_stats
from mcpd.serving.errors import RequestError
from mcpd.serving.loader import Loader
from mcpd.serving.loads import Target
from mcpd.serving.worker import ModelWorker
from mcpd.snapshot import ModelStats

log = logging.getLogger("mcpd.serving")


class Repository:
    def __init__(
        self,
        batch_size: Callable[[str], int],
        events: EventBus,
        limit: int,
        optimizer: Optimizer | None = None,
        *,
        open_backend: Callable[[ModelSection, ModelPlacement], Backend] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.events = events
        self.entries: dict[str, Entry] = {}
        self.loader = Loader(
            self.entries,
            batch_size,
            events,
            limit,
            optimizer,
            # Looked up now, not at import: tests put a gated builder in its place.
            backends.load if open_backend is None else open_backend,
            clock,
        )

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
        """Sessions being built (a replacement builds while the previous version serves)."""
        return self.loader.building

    @property
    def all_ready(self) -> bool:
        """Every model serves but those a client unloaded (Triton counts only the models it was
        asked to load)."""
        return all(
            entry.worker is not None or entry.state == "unloaded" for entry in self.entries.values()
        )

    def stats(self) -> dict[str, ModelStats]:
        return {name: entry_stats(entry) for name, entry in self.entries.items()}

    # -- changes ---------------------------------------------------------------------------------

    async def apply(
        self, models: tuple[ModelSection, ...], placements: Mapping[str, ModelPlacement] = {}
    ) -> None:
        """Make the served set match `models`, each with its threads where `placements` puts
        them (a model placed elsewhere is loaded again). Returns once unloads are done; loads go
        on in the background."""
        wanted = {model.name: model for model in models}
        for name in [name for name in self.entries if name not in wanted]:
            removed = self.entries.pop(name)
            self.loader.drop(removed)
            log.info("model %s removed from the configuration; unloading", name)
            await self.loader.retire(removed.worker)
            self.events.publish(Event("model", f"model {name} unloaded", {"model": name}))
        for name, model in wanted.items():
            entry = self.entries.get(name)
            file = file_identity(model.path)
            placement = placements.get(name, UNPLACED)
            if entry is not None and (entry.config, entry.file, entry.placement) == (
                model,
                file,
                placement,
            ):
                continue
            if entry is None:
                entry = self.entries[name] = Entry(model, file, placement)
            elif entry.state == "unloaded":  # stays unloaded until a client loads it
                entry.config, entry.file, entry.placement = model, file, placement
                continue
            self.loader.want(entry, Target(model, file, placement=placement))

    async def load(self, name: str) -> None:
        """A client's load request: read the configured model's file again and swap it in, like a
        reload of a replaced file; returns once it serves. A load of what is being built joins
        that build. A load that fails leaves the previous version (if any) serving and raises a
        400 naming the file and the reason (Triton answers a failed load with INVALID_ARG)."""
        entry = self.get(name)
        model = entry.config
        target = Target(model, file_identity(model.path), placement=entry.placement)
        load, answer = self.loader.want(entry, target)
        # Shielded: a client that hangs up does not cancel a load that others may be waiting for.
        error = await asyncio.shield(answer)
        if error is not None:
            serving = "the previous version serves on" if entry.worker else "it does not serve"
            raise RequestError(f"model {name!r}: loading {model.path} failed ({serving}): {error}")
        if self.entries.get(name) is not entry or entry.loads.wanted is not load:
            raise RequestError(f"model {name!r}: a later reload, load or unload overtook this load")

    async def unload(self, name: str) -> None:
        """A client's unload request: stop taking requests for the model, finish those it already
        took, release it. It stays unloaded (through config reloads too) until a load request."""
        entry = self.get(name)
        old, entry.worker, entry.interface = entry.worker, None, None
        self.loader.drop(entry)  # a session still building is released when it ends
        entry.state, entry.error = "unloaded", None
        log.info("model %s unloaded on request", name)
        self.events.publish(
            Event(
                "model", f"model {name} unloaded on request", {"model": name, "state": "unloaded"}
            )
        )
        await self.loader.retire(old)

    async def close(self) -> None:
        """Finish what is queued, release every model."""
        workers = [entry.worker for entry in self.entries.values() if entry.worker is not None]
        self.entries.clear()
        await self.loader.close(workers)
