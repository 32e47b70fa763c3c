"""A FUSE file system over one folder of a simulated board, whose chosen file hangs in read(2) until
told otherwise: a wedged driver, for the system tests' watchdog and start-up checks.

mcpd opens sensor files with O_NONBLOCK and reads regular files only, so a FIFO no longer hangs it;
but a real attribute whose driver is stuck (an I2C bus that never answers) is a regular file whose
read(2) sleeps in the kernel, and so is a file of this FUSE file system: O_NONBLOCK changes nothing.

Run as: python -m tests.support.fusewedge MOUNT_NAMESPACE FOLDER NAME CONTROL_DIR

It enters MOUNT_NAMESPACE (a /proc/PID/ns/mnt file: the test's systemd, for a service started
afterwards, or a running service's own) while it is still single-threaded, keeps a descriptor of
FOLDER and mounts itself over FOLDER there, passing every file through (the simulator keeps
writing the folder underneath). A read of NAME creates CONTROL_DIR/blocked and waits until
CONTROL_DIR/release exists.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
import time
from typing import Any

import mfusepy as fuse

CLONE_NEWNS = 0x00020000


def enter_mount_namespace(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns")
    finally:
        os.close(fd)


class Wedge(fuse.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, folder: int, name: str, control: int) -> None:
        self.folder = folder
        self.name = "/" + name
        self.control = control
        """A descriptor of CONTROL_DIR opened before entering the namespace: a service's own
        namespace may show that folder read-only (ProtectSystem=strict), the descriptor does not."""

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        try:
            if path == "/":
                st = os.fstat(self.folder)
            else:
                st = os.stat(path.lstrip("/"), dir_fd=self.folder, follow_symlinks=False)
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None
        attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size")}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        if stat.S_ISREG(st.st_mode):
            attrs["st_size"] = 4096  # sysfs attributes all claim a page
        return attrs

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self.folder)]

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        if path == self.name:
            os.close(os.open("blocked", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=self.control))
            while not _exists("release", self.control):
                time.sleep(0.01)
        try:
            fd = os.open(path.lstrip("/"), os.O_RDONLY, dir_fd=self.folder)
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)


def _exists(name: str, folder: int) -> bool:
    try:
        os.stat(name, dir_fd=folder)
    except FileNotFoundError:
        return False
    return True


def main() -> None:
    namespace, folder, name, control = sys.argv[1:5]
    control_fd = os.open(control, os.O_RDONLY | os.O_DIRECTORY)
    enter_mount_namespace(namespace)
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    fuse.FUSE(
        Wedge(descriptor, name, control_fd),
        folder,
        foreground=True,
        direct_io=True,
        ro=True,
        allow_other=True,
    )


if __name__ == "__main__":
    main()
