"""Files that are what mcpd expects, however hostile what is found in their place.

The one home of mcpd's file safety, for the daemon (`mcpd`) and the sensor adapters (`sensors`)
alike: a top-level package that imports neither, because sensor adapters may not import the daemon
(pyproject.toml's layer contracts) and the daemon should not read its own files through a sensor
adapter.

Every file mcpd reads is opened non-blocking (a FIFO in a sensor's or a config file's place would
otherwise hang open() for good) and refused unless it is a regular file (a FIFO, a device such as
/dev/zero, a socket, a folder): `open_regular`.

mcpd's state and runtime folders (/var/lib/mcpd, /run/mcpd) belong to the unprivileged `mcpd` user,
yet `mcpd restore` runs in them as root (systemd's ExecStopPost=+). Anything found there may have
been planted: a symlink at the name of a temporary file would make root truncate whatever it points
to, a FIFO would make an open() block for ever, a huge file would be read whole. So:

- a folder is opened once, without following a symlink at its last component, and every file in it
  is opened relative to that descriptor (dir_fd) with O_NOFOLLOW;
- a file is written by creating a fresh, unpredictable name with O_EXCL (never an existing one),
  fsyncing it and renaming it over the target: rename(2) replaces a planted symlink, never follows it;
- a file is read only when it is a regular file of bounded size, opened with O_NONBLOCK, and a JSON
  state file is parsed only to a bounded depth (a file of 100 000 `[` once ended `mcpd run` and
  root's `mcpd restore` with a RecursionError);
- nothing is chowned: what root writes stays root's and is made readable (0644) for the daemon,
  which owns the folder and so can still replace or remove it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from pathlib import Path

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


PAGE_SIZE = 4096
"""What `read_text` reads: one page, as the kernel serves a sysfs or procfs file."""

JSON_DEPTH = 32
"""Deeper than any document mcpd writes (the deepest, a baseline or learned peaks, is 4)."""


class UnsafeFileError(OSError):
    """A path that is not what mcpd writes there: a symlink, a FIFO, a folder, an oversized file."""


class NotAFile(OSError):
    """Something other than a regular file where one was expected (FIFO, device, socket,
    directory), or a sysfs attribute longer than any attribute is."""


class CorruptFileError(ValueError):
    """A regular file that is not what mcpd writes in it: not UTF-8 JSON, or nested too deep."""


def file_kind(mode: int) -> str:
    """What a non-regular file is, for error messages."""
    kinds = {
        stat.S_IFDIR: "a directory",
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
    }
    return kinds.get(stat.S_IFMT(mode), "not a plain file")


def open_regular(
    path: str | Path,
    *,
    follow_symlinks: bool = True,
    access: int = os.O_RDONLY,
    dir_fd: int | None = None,
) -> int:
    """A descriptor for a regular file (by default for reading), opened without ever blocking:
    O_NONBLOCK makes open() of a FIFO return at once (or fail with ENXIO for writing), and
    anything but a regular file raises NotAFile. The one way mcpd opens the files it reads
    (sensors, config, spool, verdicts, state files) and the spool it appends to."""
    flags = access | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags if follow_symlinks else flags | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotAFile(f"not a regular file ({file_kind(mode)})")
    except OSError:
        os.close(fd)
        raise
    return fd


def read_text(path: str | Path) -> str:
    """The first page of a regular file, as text: a sysfs or procfs value, or a small file such as
    /etc/machine-id. Raises OSError (NotAFile for anything but a regular file)."""
    fd = open_regular(path)
    try:
        return os.read(fd, PAGE_SIZE).decode("ascii", errors="replace")
    finally:
        os.close(fd)


def open_folder(path: str | Path, *, create: bool = False, mode: int = 0o750) -> int:
    """A descriptor of the folder at `path` (created with `mode` when asked), refusing a symlink
    in its place. Raises OSError."""
    if create:
        os.makedirs(path, mode=mode, exist_ok=True)
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise UnsafeFileError(exc.errno, "a symlink, not a folder", str(path)) from None
        raise


def read_file(folder: int, name: str, limit: int) -> bytes | None:
    """The contents of the regular file `name` in `folder`; None when there is none. Raises
    UnsafeFileError for anything else at that name (or a file over `limit` bytes), OSError when
    it cannot be read."""
    try:
        fd = open_regular(name, follow_symlinks=False, dir_fd=folder)
    except FileNotFoundError:
        return None
    except NotAFile:
        raise UnsafeFileError(errno.EINVAL, "not a regular file, refused", name) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(exc.errno, "a symlink, refused", name) from None
        raise
    try:
        info = os.fstat(fd)
        if info.st_size > limit:
            raise UnsafeFileError(errno.EFBIG, f"over {limit} bytes, refused", name)
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # grew while we read
            raise UnsafeFileError(errno.EFBIG, f"over {limit} bytes, refused", name)
        return data
    finally:
        os.close(fd)


def parse_json(data: bytes, depth: int = JSON_DEPTH) -> object:
    """The JSON document in `data`. Raises CorruptFileError naming what is wrong."""
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CorruptFileError(f"not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CorruptFileError(f"not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:  # json's C scanner stops at the interpreter's recursion limit
        raise CorruptFileError(f"nested deeper than {depth} levels") from None
    if _depth(document, depth) > depth:
        raise CorruptFileError(f"nested deeper than {depth} levels")
    return document


def _depth(document: object, limit: int) -> int:
    """The nesting depth of a parsed document, counted without recursion and no further than
    one level past `limit`."""
    deepest, level = 0, [(document, 1)]
    while level:
        value, depth = level.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth > limit:
                break
            children = value.values() if isinstance(value, dict) else value
            level.extend((child, depth + 1) for child in children)
    return deepest


def read_json(folder: int, name: str, limit: int, depth: int = JSON_DEPTH) -> object | None:
    """The JSON document in the regular file `name` in `folder`; None when there is none. Raises
    CorruptFileError when it is not JSON (or is nested deeper than `depth`), and as read_file."""
    data = read_file(folder, name, limit)
    return None if data is None else parse_json(data, depth)


def write_file(folder: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Replace `name` in `folder` with `data`, atomically and durably. Raises OSError (the file
    stays as it was)."""
    temporary = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, _CREATE_FLAGS, mode, dir_fd=folder)
    try:
        try:
            os.fchmod(
                fd, mode
            )  # whatever the umask: the daemon must be able to read what root wrote
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            remove(folder, temporary)
        raise
    os.fsync(folder)


def remove(folder: int, name: str) -> None:
    """Remove `name` from `folder` if it is there (unlink never follows a symlink)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=folder)


def rename(folder: int, name: str, new_name: str) -> None:
    os.replace(name, new_name, src_dir_fd=folder, dst_dir_fd=folder)
