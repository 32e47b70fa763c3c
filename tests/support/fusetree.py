"""A FUSE pass-through over a fake sysfs tree that answers chosen files with a chosen errno.

Regular files cannot fail the way sysfs attributes do (ENODATA from a disabled INA3221 channel,
EAGAIN from a power-gated Tegra zone, EIO from a down device, EACCES from RAPL for non-root, EBUSY
from a cap the driver will not change now), so the quirk tests mount the fixture tree through this
and get those errors from real read(2) and write(2) calls.

Run as: python -m tests.support.fusetree SOURCE MOUNTPOINT RULES

RULES maps a path to what its calls do: `{"rel/path": "EAGAIN"}` fails reads (and opens, for
EACCES); `"write:EBUSY"` fails writes and leaves reads alone; `"write:keep"` takes a write and keeps
the value (a driver that ignores it); `"write:max=N"` keeps at most N (a limit of the kernel's own,
as cpufreq's QoS holds a cap under a cooling device's). Every other write goes through to SOURCE. RULES is JSON, or `@FILE` naming a JSON file that is read again at every call,
so that a test can start and end a fault while the tree is mounted.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from typing import Any

import mfusepy as fuse

WRITE = "write:"


class ErrnoOverlay(fuse.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, source: str, rules: str) -> None:
        self.source = source
        self.rules = rules

    def _rules(self) -> dict[str, str]:
        text = self.rules
        if text.startswith("@"):
            with open(text[1:], encoding="utf-8") as file:
                text = file.read()
        return {"/" + path.strip("/"): rule for path, rule in json.loads(text).items()}

    def _rule(self, path: str, writing: bool) -> str | None:
        rule = self._rules().get(path)
        if rule is None or rule.startswith(WRITE) != writing:
            return None
        return rule.removeprefix(WRITE)

    def _error(self, path: str, writing: bool) -> int | None:
        rule = self._rule(path, writing)
        code: int | None = None if rule is None else getattr(errno, rule, None)
        return code

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
        if self._error(path, writing=False) == errno.EACCES:
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        code = self._error(path, writing=False)
        if code is not None:
            raise fuse.FuseOSError(code)
        with open(self._real(path), "rb") as file:
            file.seek(offset)
            return file.read(size)

    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        return 0  # a sysfs attribute ignores truncation: a refused write leaves its value

    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
        """As a sysfs attribute's store: the write is the whole new value."""
        code = self._error(path, writing=True)
        if code is not None:
            raise fuse.FuseOSError(code)
        rule = self._rule(path, writing=True) or ""
        kept = data
        if rule == "keep":
            return len(data)
        if rule.startswith("max="):
            kept = b"%d\n" % min(int(data), int(rule.removeprefix("max=")))
        with open(self._real(path), "wb") as file:
            file.write(kept)
        return len(data)


def main() -> None:
    source, mountpoint, rules = sys.argv[1:4]
    fuse.FUSE(ErrnoOverlay(source, rules), mountpoint, foreground=True, direct_io=True)


if __name__ == "__main__":
    main()
