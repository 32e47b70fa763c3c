"""A FUSE pass-through over a fake sysfs tree that answers chosen files with a chosen errno.

Regular files cannot fail the way sysfs attributes do (ENODATA from a disabled INA3221 channel,
EAGAIN from a power-gated Tegra zone, EIO from a down device, EACCES from RAPL for non-root), so the
quirk tests mount the fixture tree through this and get those errors from real read(2) calls.

Run as: python -m tests.fusetree SOURCE MOUNTPOINT ERRNO_MAP_JSON   ({"rel/path": "EAGAIN", ...})
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from typing import Any

import mfusepy as fuse


class ErrnoOverlay(fuse.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, source: str, errors: dict[str, str]) -> None:
        self.source = source
        self.errors = {"/" + path.strip("/"): getattr(errno, name) for path, name in errors.items()}

    def _real(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None
        attrs = {
            key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size")
        }
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        if stat.S_ISREG(st.st_mode):
            attrs["st_size"] = 4096  # sysfs attributes all claim a page
        return attrs

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def open(self, path: str, flags: int) -> int:
        if path in self.errors and self.errors[path] == errno.EACCES:
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        if path in self.errors:
            raise fuse.FuseOSError(self.errors[path])
        with open(self._real(path), "rb") as file:
            file.seek(offset)
            return file.read(size)


def main() -> None:
    source, mountpoint, errors = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    fuse.FUSE(ErrnoOverlay(source, errors), mountpoint, foreground=True, direct_io=True, ro=True)


if __name__ == "__main__":
    main()
