"""The shared block (mcpd.ipc) as the governor fills it for the serving process: each model's
batch size in its slot, and the status document that serving answers status from."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mcpd.config import Config
from mcpd.ipc import SLOTS, SharedBlock
from mcpd.status import StatusDocument

STATUS_S = 1.0
"""How often the status document in shared memory is refreshed, besides after every governor
action (an event wakes the supervisor): the serving process answers status from it."""


class ServingBlock:
    def __init__(
        self,
        status: Callable[[], StatusDocument],
        batch_sizes: Callable[[], Mapping[str, int]],
    ) -> None:
        self._status = status
        self._batch_sizes = batch_sizes
        self.block: SharedBlock | None = None
        self.slots: dict[str, int] = {}
        """Each configured model's slot; a model keeps its slot for the governor's lifetime."""
        self._published_batch: Mapping[str, int] | None = None
        self._status_at = -1e9

    @property
    def status_due(self) -> float:
        return self._status_at + STATUS_S

    def open(self, config: Config) -> None:
        self.block = SharedBlock.create()
        self.assign_slots(config)

    def close(self) -> None:
        if self.block is not None:
            self.block.close()
            self.block = None

    def assign_slots(self, config: Config) -> None:
        """Keep each configured model's slot; a new model takes the lowest one no configured model
        holds (a removed model's slot is free again)."""
        names = [model.name for model in config.models]
        self.slots = {name: slot for name, slot in self.slots.items() if name in names}
        free = iter(sorted(set(range(SLOTS)) - set(self.slots.values())))
        for name in names:
            if name not in self.slots:
                self.slots[name] = next(free)

    def publish(self, now: float, changed: bool) -> bool:
        """Batch sizes whenever the governor changes them; the status document when `changed`
        (a governor action, a serving process started or gone) and once a second. True when the
        status was written."""
        assert self.block is not None
        sizes = self._batch_sizes()
        if sizes is not self._published_batch:
            for name, size in sizes.items():
                slot = self.slots.get(name)
                if slot is not None:
                    self.block.set_batch(slot, size)
            self._published_batch = sizes
        if not changed and now - self._status_at < STATUS_S:
            return False
        self.block.set_status(self._status())
        self._status_at = now
        return True
