"""Triton's system shared memory extension (docs/serving-protocol.md §2.2): clients register POSIX
shared memory objects (/dev/shm/KEY) by name and pass tensors through them instead of the socket.

The object stays the client's: it can shrink it (ftruncate) at any moment. A mapping would then
kill the daemon with SIGBUS on the next access, so objects are never mapped: tensors are read and
written with pread/pwrite, after an fstat that checks the window still fits, and a short read (a
shrink racing the fstat) is an error too. Either way the request gets a 400 naming the region.

Only regular objects the registering client owns are accepted (owner uid checked against the socket
peer's credentials; root may register any), keys are plain names (no paths, no symlinks), and a
region is visible and usable only by the uid that registered it, and root. A client whose uid the
daemon cannot see (under systemd's PrivateUsers=, every uid but root's and mcpd's reads as the
overflow uid: systemd.exec(5) PrivateUsers=, user_namespaces(7)) cannot be told from other such
clients, so it may not register.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass

import numpy as np

from mcpd.serving.errors import RequestError

MAX_REGIONS = 64
"""Registered regions, all clients together: each keeps one descriptor open."""
OVERFLOW_UID_FILE = "/proc/sys/kernel/overflowuid"
"""The uid an unmapped user appears as inside a user namespace (user_namespaces(7))."""


def overflow_uid(path: str = OVERFLOW_UID_FILE) -> int:
    try:
        with open(path, encoding="ascii") as file:
            return int(file.read())
    except (OSError, ValueError):
        return 65534  # the kernel's default


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    owner: int
    """The uid that registered it."""

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
    def __init__(self, root: str = "/dev/shm", unmapped_uid: int | None = None) -> None:
        self.root = root
        self.unmapped_uid = overflow_uid() if unmapped_uid is None else unmapped_uid
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int, uid: int) -> None:
        if uid == self.unmapped_uid:
            raise RequestError(
                f"shared memory: this client's user is not visible to mcpd (it reads as uid "
                f"{uid}, as every user but root and mcpd does under the unit's PrivateUsers=), "
                "so its regions could not be kept from other users"
            )
        if name in self._regions:
            raise RequestError(f"shared memory region {name!r} is already registered")
        if len(self._regions) >= MAX_REGIONS:
            raise RequestError(f"shared memory: {MAX_REGIONS} regions are registered already")
        base = key[1:] if key.startswith("/") else key
        if not base or "/" in base or "\0" in base or base in (".", ".."):
            raise RequestError(f"shared memory key {key!r} is not a POSIX shared memory name")
        if byte_size <= 0:
            raise RequestError("shared memory byte_size must be > 0")
        try:
            fd = os.open(os.path.join(self.root, base), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, UnicodeEncodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not a valid file name"
            if isinstance(exc, OSError) and exc.errno == errno.EACCES:
                why = (
                    f"{why} (mcpd runs as its own user: give the object mode 0660 and mcpd's "
                    "group, as mcpd.client's create_region does)"
                )
            raise RequestError(f"cannot open shared memory key {key!r}: {why}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise RequestError(f"shared memory key {key!r} is not a shared memory object")
            if uid != 0 and info.st_uid != uid:
                raise RequestError(f"shared memory key {key!r} belongs to another user")
            if offset + byte_size > info.st_size:
                raise RequestError(
                    f"shared memory key {key!r} has {info.st_size} bytes; offset {offset} + "
                    f"byte_size {byte_size} runs past its end"
                )
        except RequestError:
            os.close(fd)
            raise
        self._regions[name] = Region(name, key, offset, byte_size, fd, uid)

    def unregister(self, name: str | None, uid: int | None) -> None:
        """One region, or all of those the client may see; unknown names are ignored
        (unregistering is idempotent)."""
        names = [r.name for r in self._visible(uid)] if name is None else [name]
        for region_name in names:
            region = self._regions.get(region_name)
            if region is not None and _may_use(region, uid):
                del self._regions[region_name]
                os.close(region.fd)

    def status(self, name: str | None, uid: int | None) -> list[dict[str, object]]:
        if name is None:
            return [region.status() for region in self._visible(uid)]
        return [self.region(name, uid).status()]

    def peer(self, uid: int | None) -> PeerMemory:
        return PeerMemory(self, uid)

    def _visible(self, uid: int | None) -> list[Region]:
        return [region for region in self._regions.values() if _may_use(region, uid)]

    def region(self, name: str, uid: int | None) -> Region:
        region = self._regions.get(name)
        if region is None or not _may_use(region, uid):
            raise RequestError(f"unknown shared memory region {name!r}", 404)
        return region

    def close(self) -> None:
        for region in self._regions.values():
            with contextlib.suppress(OSError):
                os.close(region.fd)
        self._regions.clear()


def _may_use(region: Region, uid: int | None) -> bool:
    return uid == 0 or uid == region.owner


@dataclass(frozen=True)
class PeerMemory:
    """The regions as one client may use them."""

    registry: SharedMemory
    uid: int | None

    def read(self, ref: ShmRef, dtype: np.dtype[np.generic], count: int) -> np.ndarray:
        array = np.empty(count, dtype)
        region, start = self._place(ref, array.nbytes)
        try:
            got = os.preadv(region.fd, [array.view(np.uint8).data], start) if count else 0
        except OSError as exc:
            raise _failed(region, exc) from None
        if got != array.nbytes:
            raise self._shrunk(region, start + got)
        return array

    def write(self, ref: ShmRef, array: np.ndarray) -> None:
        """A shrink racing the size check makes pwrite grow the object back: its owner's doing,
        and no harm to the daemon."""
        region, start = self._place(ref, array.nbytes)
        try:
            os.pwrite(region.fd, np.ascontiguousarray(array).view(np.uint8).data, start)
        except OSError as exc:  # ENOSPC: a full /dev/shm
            raise _failed(region, exc) from None

    def _place(self, ref: ShmRef, need: int) -> tuple[Region, int]:
        """The region and the file position of `need` bytes at ref, checked against the
        registered window and against the object's size now."""
        region = self.registry.region(ref.region, self.uid)
        if ref.offset + ref.byte_size > region.byte_size:
            raise RequestError(
                f"shared memory offset {ref.offset} + byte_size {ref.byte_size} is outside "
                f"region {ref.region!r} ({region.byte_size} bytes)"
            )
        if need > ref.byte_size:
            raise RequestError(
                f"tensor needs {need} bytes but shared_memory_byte_size is {ref.byte_size}"
            )
        start = region.offset + ref.offset
        try:
            size = os.fstat(region.fd).st_size
        except OSError as exc:
            raise _failed(region, exc) from None
        if start + need > size:
            raise self._shrunk(region, size)
        return region, start

    @staticmethod
    def _shrunk(region: Region, size: int) -> RequestError:
        return RequestError(
            f"shared memory region {region.name!r} (key {region.key!r}) was shrunk to {size} "
            f"bytes; it was registered with offset {region.offset} + byte_size "
            f"{region.byte_size}"
        )


def _failed(region: Region, exc: OSError) -> RequestError:
    return RequestError(
        f"shared memory region {region.name!r} (key {region.key!r}): {exc.strerror}"
    )
