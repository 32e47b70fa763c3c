"""Inference backends behind one small interface, chosen from a name table by trying the import.

A backend module is imported only when a model needs it, so a board without rknn-toolkit-lite2 or
OpenVINO (or an x86 box without RKNN at all) still starts and serves its other models.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from mcpd.config import EXTENSIONS, ModelSection
from mcpd.placement import affinity
from mcpd.placement.plan import UNPLACED, ModelPlacement
from mcpd.serving.errors import LoadError
from mcpd.serving.tensors import TensorSpec

_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)
"""glibc's; absent from musl, where freed memory goes back on its own."""

MODULES = {
    "onnxruntime": "mcpd.serving.backends.onnxrt",
    "rknn": "mcpd.serving.backends.rknn",
    "openvino": "mcpd.serving.backends.openvino",
}


class Backend(Protocol):
    kind: str
    platform: str
    """The protocol's "<project>_<format>" platform string (information only)."""
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    fixed_batch: int | None
    """The batch size the model only accepts, or None where the batch dimension is free."""
    parallel: int
    """How many batches it runs at once (OpenVINO's streams; 1 for the others): the model's worker
    keeps that many in flight."""
    detail: Mapping[str, object]
    """What was chosen at load (provider, cores), for status and logs."""
    warnings: tuple[str, ...]
    """What the load had to settle for (a provider missing or failing to start, an option
    ignored). The repository says them, the same one at most once a minute: a backend that logged
    them itself said them at every load (1 382 lines in 3 s of a client loading in a loop)."""

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One batch: arrays in `inputs` order in, arrays in `outputs` order out. Thread-safe."""
        ...

    def close(self) -> None: ...


def kind_of(model: ModelSection) -> str:
    kind = model.served_by()
    if kind is None:
        known = ", ".join(EXTENSIONS)
        raise LoadError(
            f"cannot tell the backend from extension {model.suffix!r} ({known}); set backend"
        )
    return kind


def load(model: ModelSection, placement: ModelPlacement = UNPLACED) -> Backend:
    """Blocking (seconds for a big model): call it from a worker thread, never the event loop.
    The loading thread runs on the model's CPUs meanwhile, so that the threads the runtime
    starts there begin on them (and OpenVINO, which maps the CPUs it may use, finds them)."""
    kind = kind_of(model)
    if not Path(model.path).is_file():
        raise LoadError(f"model file {model.path} does not exist")
    module = importlib.import_module(MODULES[kind])
    with affinity.pinned(placement.allowed, f"model {model.name}'s load"):
        backend: Backend = module.open_model(model, placement)
    return backend


def served_datatype(types: Mapping[str, str], name: str, runtime_type: str) -> str:
    """The protocol datatype of tensor `name`, from its runtime's type name through `types` (the
    runtime's table); a LoadError names a type mcpd does not serve."""
    if runtime_type not in types:
        raise LoadError(f"tensor {name!r} has type {runtime_type}, which mcpd does not serve")
    return types[runtime_type]


def fixed_batch(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> int | None:
    """The model's batch dimension (the first of every tensor): free (-1) or one fixed size."""
    for spec in (*inputs, *outputs):
        if not spec.shape:
            raise LoadError(
                f"tensor {spec.name!r} is a scalar; served models need a batch dimension"
            )
    sizes = {spec.shape[0] for spec in inputs}
    if sizes == {-1}:
        return None
    if len(sizes) == 1 and -1 not in sizes:
        return sizes.pop()
    raise LoadError(f"inputs disagree on the batch dimension: {sorted(sizes)}")


def trim_heap() -> None:
    """Give the memory a closed session freed back to the system. glibc keeps it in its heaps
    otherwise: a model of 100 MB in a hundred 1 MB tensors left the process at 290 MB after its
    session was closed, 80 MB after malloc_trim (7.5 ms; 60 ms for sixteen such sessions, 1.9 GB);
    onnxruntime's own arenas are freed with the session."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def release(backend: Backend) -> None:
    """Close a backend nobody serves from and give its memory back. Blocking: call it from a
    worker thread."""
    backend.close()
    trim_heap()
