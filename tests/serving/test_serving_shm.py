"""Shared memory registry: only regular objects the client owns, every access checked against the
registered window and against the object's size at that moment, each region only for its owner."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mcpd.serving.errors import RequestError
from mcpd.serving.shm import MAX_REGIONS, SharedMemory, ShmRef
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config

ME = 1000  # two ordinary users (the tests run as root, who may use every region)
OTHER = 2000
NOBODY = 65534


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[SharedMemory]:
    (tmp_path / "obj").write_bytes(bytes(range(64)))
    os.chown(tmp_path / "obj", ME, -1)
    registry = SharedMemory(str(tmp_path), unmapped_uid=NOBODY)
    yield registry
    registry.close()


def refused(shm: SharedMemory, *args: object) -> str:
    with pytest.raises(RequestError) as info:
        shm.register(*args)  # type: ignore[arg-type]
    return info.value.message


def test_register_read_write_and_status(shm: SharedMemory, tmp_path: Path) -> None:
    shm.register("r", "/obj", 16, 32, ME)
    assert shm.status(None, ME) == [{"name": "r", "key": "/obj", "offset": 16, "byte_size": 32}]
    memory = shm.peer(ME)
    assert memory.read(ShmRef("r", 4, 8), np.dtype(np.uint8), 8).tolist() == list(range(20, 28))
    memory.write(ShmRef("r", 0, 4), np.full(4, 255, np.uint8))
    assert (tmp_path / "obj").read_bytes()[16:20] == b"\xff" * 4  # the client's object itself
    shm.unregister("r", ME)
    shm.unregister("r", ME)  # idempotent
    assert shm.status(None, ME) == []


def test_bounds_are_checked(shm: SharedMemory) -> None:
    assert "offset 60 + byte_size 8 runs past its end" in refused(shm, "r", "obj", 60, 8, 0)
    shm.register("r", "obj", 0, 16, 0)
    memory = shm.peer(0)
    with pytest.raises(RequestError, match=r"offset 8 \+ byte_size 16 is outside region 'r'"):
        memory.read(ShmRef("r", 8, 16), np.dtype(np.uint8), 16)
    with pytest.raises(RequestError, match="needs 12 bytes but shared_memory_byte_size is 8"):
        memory.read(ShmRef("r", 0, 8), np.dtype(np.uint8), 12)
    with pytest.raises(RequestError, match="unknown shared memory region 'q'") as info:
        memory.read(ShmRef("q", 0, 8), np.dtype(np.uint8), 8)
    assert info.value.status == 404


def test_a_region_shrunk_under_the_daemon_is_a_400_naming_it(
    shm: SharedMemory, tmp_path: Path
) -> None:
    shm.register("r", "obj", 16, 48, ME)
    os.truncate(tmp_path / "obj", 20)  # the client shrinks its object after registering it
    memory = shm.peer(ME)
    for access in (
        lambda: memory.read(ShmRef("r", 0, 32), np.dtype(np.uint8), 32),
        lambda: memory.write(ShmRef("r", 0, 32), np.zeros(32, np.uint8)),
    ):
        with pytest.raises(RequestError, match=r"region 'r' \(key 'obj'\) was shrunk to 20 bytes"):
            access()
    assert memory.read(ShmRef("r", 0, 4), np.dtype(np.uint8), 4).tolist() == [16, 17, 18, 19]


def test_only_the_clients_own_regular_objects(shm: SharedMemory, tmp_path: Path) -> None:
    assert "belongs to another user" in refused(shm, "r", "obj", 0, 8, OTHER)
    os.symlink(tmp_path / "obj", tmp_path / "link")
    assert "cannot open shared memory key 'link'" in refused(shm, "r", "link", 0, 8, 0)
    os.mkfifo(tmp_path / "fifo")
    assert "is not a shared memory object" in refused(shm, "r", "fifo", 0, 8, 0)
    for key in ("../etc/passwd", "a/b", "", "/", "..", "a\0b"):
        assert "is not a POSIX shared memory name" in refused(shm, "r", key, 0, 8, 0)
    assert "not a valid file name" in refused(shm, "r", "a\ud800", 0, 8, 0)
    assert "cannot open shared memory key 'nope'" in refused(shm, "r", "nope", 0, 8, 0)
    assert "byte_size must be > 0" in refused(shm, "r", "obj", 0, 0, 0)
    shm.register("r", "obj", 0, 8, 0)
    assert "already registered" in refused(shm, "r", "obj", 0, 8, 0)


def test_a_user_the_daemon_cannot_see_may_not_register(shm: SharedMemory) -> None:
    # Under PrivateUsers= every user but root and mcpd reads as the overflow uid: two such
    # clients could not be told apart.
    assert "is not visible to mcpd" in refused(shm, "r", "obj", 0, 8, NOBODY)


def test_a_region_is_only_its_owners_and_roots(shm: SharedMemory, tmp_path: Path) -> None:
    os.chown(tmp_path / "obj", OTHER, -1)
    shm.register("theirs", "obj", 0, 8, OTHER)
    assert shm.status(None, ME) == []
    with pytest.raises(RequestError, match="unknown shared memory region 'theirs'"):
        shm.status("theirs", ME)
    with pytest.raises(RequestError, match="unknown shared memory region 'theirs'"):
        shm.peer(ME).read(ShmRef("theirs", 0, 8), np.dtype(np.uint8), 8)
    shm.unregister(None, ME)
    shm.unregister("theirs", ME)
    assert [r["name"] for r in shm.status(None, OTHER)] == ["theirs"]  # still there
    assert [r["name"] for r in shm.status(None, 0)] == ["theirs"]  # root sees every region
    shm.unregister(None, 0)
    assert shm.status(None, OTHER) == []


def test_regions_are_capped(shm: SharedMemory) -> None:
    for n in range(MAX_REGIONS):
        shm.register(f"r{n}", "obj", 0, 8, ME)
    assert f"{MAX_REGIONS} regions are registered already" in refused(shm, "x", "obj", 0, 8, ME)


def test_a_shrunk_region_over_the_socket(tmp_path: Path) -> None:
    """The reproduction: register, shrink, infer. The daemon used to die of SIGBUS."""
    model = {"name": "m", "path": str(scale(tmp_path / "scale.onnx"))}
    key = f"mcpd-test-{os.getpid()}"
    obj = Path("/dev/shm") / key
    obj.write_bytes(np.arange(8, dtype=np.float32).tobytes())
    server = Served(config(tmp_path, [model]))
    try:
        server.wait_settled()
        with server.client() as client:
            body = json.dumps({"key": key, "byte_size": 32}).encode()
            reply = client.request("POST", "/v2/systemsharedmemory/region/t/register", body)
            assert reply.status == 200
            request = {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [2, 4],
                        "parameters": {"shared_memory_region": "t", "shared_memory_byte_size": 32},
                    }
                ]
            }
            reply = client.request("POST", "/v2/models/m/infer", json.dumps(request).encode())
            assert reply.status == 200
            os.truncate(obj, 4)
            reply = client.request("POST", "/v2/models/m/infer", json.dumps(request).encode())
            assert reply.status == 400
            message = json.loads(reply.body)["error"]
            assert "region 't' (key" in message and "was shrunk to 4 bytes" in message
            assert client.live()
    finally:
        server.close()
        obj.unlink()
