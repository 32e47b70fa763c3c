"""Shared memory registry: only regular objects the client owns, every access bounds-checked."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from mcpd.serving.errors import RequestError
from mcpd.serving.shm import SharedMemory, ShmRef


@pytest.fixture
def shm(tmp_path: Path) -> SharedMemory:
    (tmp_path / "obj").write_bytes(bytes(range(64)))
    return SharedMemory(str(tmp_path))


def refused(shm: SharedMemory, *args: object) -> str:
    with pytest.raises(RequestError) as info:
        shm.register(*args)  # type: ignore[arg-type]
    return info.value.message


def test_register_view_write_and_status(shm: SharedMemory, tmp_path: Path) -> None:
    shm.register("r", "/obj", 16, 32, os.getuid())
    assert shm.status() == [{"name": "r", "key": "/obj", "offset": 16, "byte_size": 32}]
    assert bytes(shm.view(ShmRef("r", 4, 8), 8)) == bytes(range(20, 28))
    np.frombuffer(shm.view(ShmRef("r", 0, 4), 4), np.uint8)[:] = 255
    assert (tmp_path / "obj").read_bytes()[16:20] == b"\xff" * 4  # shared, not copied
    shm.unregister("r")
    shm.unregister("r")  # idempotent
    assert shm.status() == []


def test_bounds_are_checked(shm: SharedMemory) -> None:
    assert "offset 60 + byte_size 8 runs past its end" in refused(shm, "r", "obj", 60, 8, 0)
    shm.register("r", "obj", 0, 16, 0)
    with pytest.raises(RequestError, match=r"offset 8 \+ byte_size 16 is outside region 'r'"):
        shm.view(ShmRef("r", 8, 16), 16)
    with pytest.raises(RequestError, match="needs 12 bytes but shared_memory_byte_size is 8"):
        shm.view(ShmRef("r", 0, 8), 12)
    with pytest.raises(RequestError, match="unknown shared memory region 'q'") as info:
        shm.view(ShmRef("q", 0, 8), 8)
    assert info.value.status == 404


def test_only_the_clients_own_regular_objects(shm: SharedMemory, tmp_path: Path) -> None:
    assert "belongs to another user" in refused(shm, "r", "obj", 0, 8, os.getuid() + 1000)
    os.symlink(tmp_path / "obj", tmp_path / "link")
    assert "cannot open shared memory 'link'" in refused(shm, "r", "link", 0, 8, 0)
    os.mkfifo(tmp_path / "fifo")
    assert "is not a shared memory object" in refused(shm, "r", "fifo", 0, 8, 0)
    for key in ("../etc/passwd", "a/b", "", "/", ".."):
        assert "is not a POSIX shared memory name" in refused(shm, "r", key, 0, 8, 0)
    assert "cannot open shared memory 'nope'" in refused(shm, "r", "nope", 0, 8, 0)
    assert "byte_size > 0" in refused(shm, "r", "obj", 0, 0, 0)
    shm.register("r", "obj", 0, 8, 0)
    assert "already registered" in refused(shm, "r", "obj", 0, 8, 0)


def test_unregister_while_a_request_still_reads(shm: SharedMemory) -> None:
    shm.register("r", "obj", 0, 8, 0)
    view = np.frombuffer(shm.view(ShmRef("r", 0, 8), 8), np.uint8)
    shm.unregister()
    assert view.tolist() == list(range(8))  # still mapped until the last view goes
