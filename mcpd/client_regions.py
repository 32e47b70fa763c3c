"""POSIX shared memory regions a client of mcpd creates, that the daemon can open.

mcpd runs as its own user (`mcpd`), and opens a registered object by name (docs/serving-protocol.md
§2.2). Objects made by tritonclient's helper, or by Python's multiprocessing.shared_memory, are
mode 0600: only their owner may open them, so the daemon's open fails with EACCES. A region made
here is mode 0660 and belongs to the group the daemon runs in (by default the socket's group, which
the shipped units make `mcpd` for both), so the daemon opens it through the group while it stays
the client's: mcpd still accepts only objects owned by the registering user (README, "Shared
memory").
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SHM_ROOT = "/dev/shm"
"""Where Linux keeps POSIX shared memory objects: shm_open(3) names /NAME as /dev/shm/NAME."""
MODE = 0o660


@dataclass(frozen=True)
class Slot:
    """Where a tensor lies in a registered region: the region's registered name, the tensor's
    byte size and its offset in the region."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass(frozen=True)
class InRegion:
    """An input tensor already in a registered region, given to `Client.infer` in place of an
    array."""

    slot: Slot
    datatype: str
    shape: tuple[int, ...]


class Region:
    """A shared memory object this process created and maps; `close` unmaps and removes it."""

    def __init__(
        self, key: str, byte_size: int, group: int | None = None, root: str = SHM_ROOT
    ) -> None:
        """Create `key` (a plain name, a leading "/" allowed) of `byte_size` bytes, mode 0660,
        with the group `group` (a gid; None keeps this process's group)."""
        name = key.removeprefix("/")
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"shared memory key {key!r} is not a plain name")
        if byte_size <= 0:
            raise ValueError("byte_size must be > 0")
        self.key = key
        self.byte_size = byte_size
        self.path = os.path.join(root, name)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, MODE)
        try:
            # The umask (022 for most users) took the group's write bit at creation: set it again.
            os.fchmod(fd, MODE)
            if group is not None and group != os.fstat(fd).st_gid:
                os.fchown(fd, -1, group)  # the owner may give it to any group it is a member of
            os.ftruncate(fd, byte_size)
            self._map = mmap.mmap(fd, byte_size)
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise
        self._fd = fd

    def write(self, array: np.ndarray, offset: int = 0) -> int:
        """Copy `array` (C order) in at `offset`; returns its byte size."""
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        if offset + data.size > self.byte_size:
            raise ValueError(
                f"{data.size} bytes at offset {offset} exceed the region's {self.byte_size}"
            )
        self._map[offset : offset + data.size] = data.data
        return int(data.size)

    def read(
        self, dtype: np.dtype[np.generic] | type, shape: Sequence[int], offset: int = 0
    ) -> np.ndarray:
        """A copy of the tensor at `offset`."""
        count = int(np.prod(shape))
        array: np.ndarray = np.frombuffer(self._map, np.dtype(dtype), count, offset)
        copied: np.ndarray = array.reshape(tuple(shape)).copy()
        return copied

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
