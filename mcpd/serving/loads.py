"""One model's loads: which session is being built, which waits for it, which may swap in.

A load takes seconds and the model's size in memory, and neither onnxruntime nor RKNN can be
stopped midway, so a model never builds two sessions at once and never queues loads: 16 load
requests of one model that hung up at once built 16 sessions, 2 at a time, and kept them all until
the last was built (323 -> 2 686 MB on a simulated board, issue 26). The rules:

- a load of what is being built (the same [[models]] table, file and optimized build) joins that
  build, even one an unload or a later load had overtaken: it is wanted again;
- a load of anything else waits for the build in progress, in the one waiting place; a later load
  takes that place, and the one it overtook ends at once, having cost nothing;
- only the wanted load may swap in; a build that is not wanted when it ends is released at once.

So a model has at most one session building and one serving, whatever clients send. Pure: the
repository acts on what these return, on the event loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mcpd.config import ModelSection
from mcpd.optimize.background import Built
from mcpd.placement.plan import UNPLACED, ModelPlacement

FileIdentity = tuple[int, ...]


@dataclass(frozen=True)
class Target:
    """What a load builds a session from."""

    model: ModelSection
    file: FileIdentity | None
    """The model file's identity when the load was asked for (repository.file_identity)."""
    built: Built | None = None
    """The optimized file that replaces the model's, or None for the model's own."""
    placement: ModelPlacement = UNPLACED
    """Where its threads run (the placement plan): a session is built for them."""

    def source(self) -> ModelSection:
        """The table the session is built from: the optimized file, where there is one,
        replaces the path, and a saved graph of the original must not stand in for it. A build
        OpenVINO was measured in is served by the openvino backend with `[models.openvino]`
        (its precision "auto": the one stored in the IR), with the model's threads: that
        table's where set, else those onnxruntime served the original with."""
        if self.built is None:
            return self.model
        model = self.model
        if self.built.runtime == "openvino":
            threads = model.openvino.threads or model.onnxruntime.intra_op_threads
            model = dataclasses.replace(
                model,
                backend="openvino",
                openvino=dataclasses.replace(model.openvino, threads=threads),
            )
        return dataclasses.replace(
            model,
            path=str(self.built.path),
            onnxruntime=dataclasses.replace(model.onnxruntime, optimized_model_path=""),
        )


@dataclass(eq=False)
class Load:
    """One session to build; loads are told apart by identity, never by target."""

    target: Target


class Loads:
    def __init__(self) -> None:
        self.building: Load | None = None
        self.waiting: Load | None = None
        """The next load to build, once `building` ends; never one of the same target."""
        self.wanted: Load | None = None
        """The load that may swap in: the last one asked for (and, once swapped in, the one that
        serves), or None after an unload."""

    def want(self, target: Target) -> tuple[Load, Load | None, Load | None]:
        """A load of `target` is asked for. Returns the load that brings it (new or joined), the
        load to start building now (or None), and a waiting load it overtook (or None): that one
        never started, and its requests are answered at once."""
        building, waiting = self.building, self.waiting
        if building is not None and building.target == target:
            self.wanted, self.waiting = building, None
            return building, None, waiting
        if waiting is not None and waiting.target == target:
            self.wanted = waiting
            return waiting, None, None
        load = self.wanted = Load(target)
        if building is None:
            self.building = load
            return load, load, None
        self.waiting = load
        return load, None, waiting

    def drop(self) -> Load | None:
        """Nothing is wanted any more (an unload, the model removed). Returns the waiting load,
        which is overtaken: it never starts."""
        waiting, self.waiting, self.wanted = self.waiting, None, None
        return waiting

    def finished(self, load: Load) -> tuple[bool, Load | None]:
        """`load`, which was building, ended. Returns whether it may swap in (it is still
        wanted), and the waiting load, which starts building now (or None)."""
        if load is not self.building:
            raise ValueError("only the load being built can finish")
        self.building, self.waiting = self.waiting, None
        return self.wanted is load, self.building

    def serves(self, target: Target) -> bool:
        """Whether the wanted load is of `target` and has ended (what an optimization of
        `target`'s file may replace)."""
        wanted = self.wanted
        return (
            wanted is not None
            and wanted.target == target
            and wanted is not self.building
            and wanted is not self.waiting
        )
