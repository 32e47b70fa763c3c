"""One configured model in the repository: what serves it, what loads it, its statistics, and its
part of the status. Owned by the event loop (mcpd.serving.repository changes it)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

from mcpd.config import ModelSection
from mcpd.percentiles import Durations
from mcpd.placement.plan import UNPLACED, ModelPlacement
from mcpd.serving.codec import Interface
from mcpd.serving.loads import FileIdentity, Loads, Target
from mcpd.serving.statistics import Recorder
from mcpd.serving.worker import ModelWorker
from mcpd.snapshot import ModelStats

LATENCY_WINDOW = 2048
"""The status's request latency percentiles are over this many last requests."""


@dataclass
class Entry:
    config: ModelSection
    """The configuration wanted now (a load of it may still be running)."""
    file: FileIdentity | None = None
    """The model file's identity when that load was asked for (see `file_identity`)."""
    placement: ModelPlacement = UNPLACED
    """Where the plan wants its threads now (a session is built for them)."""
    state: str = "loading"
    """loading, ready, failed or unloaded (by a client's unload request)."""
    loads: Loads = field(default_factory=Loads)
    worker: ModelWorker | None = None
    interface: Interface | None = None
    error: str | None = None
    statistics: Recorder = field(default_factory=Recorder)
    """Kept across reloads of the model: its counts since it was first configured."""
    latencies: Durations = field(default_factory=lambda: Durations(window=LATENCY_WINDOW))
    """Request latencies, appended on the event loop, read from anywhere."""
    optimized: dict[str, object] | None = None
    """What serves when `optimize` is on: precision, speedup and accuracy of the swapped-in model."""
    optimizing: tuple[Target, asyncio.Task[None]] | None = None
    """The optimization running, and the load target it optimizes: one at a time per model."""


def file_identity(path: str) -> FileIdentity | None:
    """Which file `path` names now: a file replaced by rename (a new inode) or rewritten in place
    (size, times) is a new model even when its [[models]] table is unchanged."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def stats(entry: Entry) -> ModelStats:
    """The model's statistics and state for the status document and the governor."""
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
