"""Files that nobody with write access to their folder can redirect.

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

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


JSON_DEPTH = 32
"""Deeper than any document mcpd writes (the deepest, a baseline or learned peaks, is 4)."""


class UnsafeFileError(OSError):
    """A path that is not what mcpd writes there: a symlink, a FIFO, a folder, an oversized file."""


class CorruptFileError(ValueError):
    """A regular file that is not what mcpd writes in it: not UTF-8 JSON, or nested too deep."""


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
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(exc.errno, "a symlink, refused", name) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(errno.EINVAL, "not a regular file, refused", name)
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
