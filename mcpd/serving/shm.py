"""Triton's system shared memory extension (serving-protocol.md §2.2): clients register POSIX
shared memory objects (/dev/shm/KEY) by name and pass tensors through them without copying them
through the socket.

Only objects the registering client owns are accepted (owner uid checked against the socket peer's
credentials; root may register any), only regular files (no symlinks, no path in the key), and every
access is bounds-checked against the registered window.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from dataclasses import dataclass

from mcpd.serving.errors import RequestError


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def status(self) -> dict[str, object]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


@dataclass(frozen=True)
class ShmRef:
    """A tensor's place in a region, from its shared_memory_* parameters."""

    region: str
    offset: int
    byte_size: int


class SharedMemory:
    def __init__(self, root: str = "/dev/shm") -> None:
        self.root = root
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int, uid: int | None) -> None:
        if name in self._regions:
            raise RequestError(f"shared memory region {name!r} is already registered")
        base = key[1:] if key.startswith("/") else key
        if not base or "/" in base or base in (".", ".."):
            raise RequestError(f"shared memory key {key!r} is not a POSIX shared memory name")
        if offset < 0 or byte_size <= 0:
            raise RequestError("shared memory offset must be >= 0 and byte_size > 0")
        try:
            fd = os.open(os.path.join(self.root, base), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise RequestError(f"cannot open shared memory {key!r}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise RequestError(f"shared memory {key!r} is not a shared memory object")
            if uid is not None and uid != 0 and info.st_uid != uid:
                raise RequestError(f"shared memory {key!r} belongs to another user")
            if offset + byte_size > info.st_size:
                raise RequestError(
                    f"shared memory {key!r} has {info.st_size} bytes; offset {offset} + "
                    f"byte_size {byte_size} runs past its end"
                )
            mapping = mmap.mmap(fd, info.st_size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self._regions[name] = Region(name, key, offset, byte_size, mapping)

    def unregister(self, name: str | None = None) -> None:
        """One region, or all of them; unknown names are ignored (unregistering is idempotent)."""
        names = list(self._regions) if name is None else [name]
        for region in filter(None, (self._regions.pop(n, None) for n in names)):
            # BufferError: a request still reads it; the mapping goes when its last view does.
            with contextlib.suppress(BufferError):
                region.mapping.close()

    def status(self, name: str | None = None) -> list[dict[str, object]]:
        if name is None:
            return [region.status() for region in self._regions.values()]
        return [self._get(name).status()]

    def view(self, ref: ShmRef, need: int) -> memoryview:
        """`need` bytes at ref's place, checked against the region; for reading and for writing."""
        region = self._get(ref.region)
        if ref.offset < 0 or ref.offset + ref.byte_size > region.byte_size:
            raise RequestError(
                f"shared memory offset {ref.offset} + byte_size {ref.byte_size} is outside "
                f"region {ref.region!r} ({region.byte_size} bytes)"
            )
        if need > ref.byte_size:
            raise RequestError(
                f"tensor needs {need} bytes but shared_memory_byte_size is {ref.byte_size}"
            )
        start = region.offset + ref.offset
        return memoryview(region.mapping)[start : start + need]

    def _get(self, name: str) -> Region:
        try:
            return self._regions[name]
        except KeyError:
            raise RequestError(f"unknown shared memory region {name!r}", 404) from None

    def close(self) -> None:
        self.unregister()
