"""mcpd.client's shared memory regions: mode 0660 in the daemon's group, so that a daemon running
as another user can open them, where Python's and tritonclient's 0600 objects are refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mcpd.client_regions import InRegion, Region, Slot
from tests.conftest import PROJECT
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config

DAEMON_UID = DAEMON_GID = 1  # Debian's `daemon` user and group stand in for `mcpd`
CLIENT_UID = 4242  # a user of no group but the daemon's: like a member of `mcpd`


def test_a_region_is_0660_in_the_sockets_group_whatever_the_umask(tmp_path: Path) -> None:
    model = {"name": "m", "path": str(scale(tmp_path / "m.onnx"))}
    served = Served(config(tmp_path, [model], socket_group="daemon"))
    old = os.umask(0o077)
    try:
        served.wait_settled()
        with served.client() as client:
            region = client.create_region(f"/mcpd-test-{os.getpid()}", 64)
            info = os.stat(region.path)
            assert stat.S_IMODE(info.st_mode) == 0o660
            assert info.st_gid == DAEMON_GID == os.stat(served.socket).st_gid
            x = np.arange(4, dtype=np.float32).reshape(1, 4)
            region.write(x)
            client.register("r", region)
            out = client.infer(
                "m",
                {"x": InRegion(Slot("r", 16), "FP32", (1, 4))},
                output_regions={"double": Slot("r", 16, 16)},
            )
            assert out == {}  # written into the region, not sent
            np.testing.assert_array_equal(region.read(np.float32, (1, 4), 16), x * 2)
            client.unregister("r")
            region.close()
            assert not os.path.exists(region.path)
    finally:
        os.umask(old)
        served.close()


def test_bad_keys_and_sizes_are_refused(tmp_path: Path) -> None:
    for key in ("", "/", "a/b", ".."):
        with pytest.raises(ValueError, match="not a plain name"):
            Region(key, 8, root=str(tmp_path))
    with pytest.raises(ValueError, match="byte_size must be > 0"):
        Region("k", 0, root=str(tmp_path))
    with Region("k", 8, root=str(tmp_path)) as region, pytest.raises(ValueError, match="exceed"):
        region.write(np.zeros(3, np.float32), offset=0)
    with Region("k", 8, root=str(tmp_path)), pytest.raises(FileExistsError):
        Region("k", 8, root=str(tmp_path))  # never takes over an object that exists


# Each side imports what it needs, then becomes its user: the interpreter (pyenv's, under root's
# 0700 home) could not be started by those users.
CLIENT = """
import encodings.ascii, json, os, sys
import numpy as np
from mcpd.client import Client
from mcpd.client_regions import InRegion, Slot
os.setgroups([DAEMON_GID]); os.setgid(CLIENT_UID); os.setuid(CLIENT_UID)
socket, key = sys.argv[1], sys.argv[2]
with Client(socket) as client:
    # As Python's multiprocessing.shared_memory (tritonclient's helper) makes it: mode 0600.
    private = "/dev/shm" + key + "-private"
    os.close(os.open(private, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    os.truncate(private, 64)
    body = json.dumps({"key": key + "-private", "offset": 0, "byte_size": 64}).encode()
    reply = client.request("POST", "/v2/systemsharedmemory/region/private/register", body)
    os.unlink(private)
    print("refused:", reply.status, json.loads(reply.body)["error"])
    with client.create_region(key, 64) as region:
        region.write(np.arange(4, dtype=np.float32).reshape(1, 4))
        client.register("mine", region)
        client.infer("m", {"x": InRegion(Slot("mine", 16), "FP32", (1, 4))},
                     output_regions={"double": Slot("mine", 16, 16)})
        print("doubled:", region.read(np.float32, (4,), 16).tolist())
        client.unregister()
"""

DAEMON = """
import encodings.ascii, os, sys
from pathlib import Path
from tests.support.serving_server import Served, config
os.setgroups([]); os.setgid(DAEMON_GID); os.setuid(DAEMON_UID)
folder = Path(sys.argv[1])
model = {"name": "m", "path": str(folder / "m.onnx")}
served = Served(config(folder, [model], socket_group="daemon", state_dir=str(folder)))
served.wait_settled()
print("ready", flush=True)
sys.stdin.read()
served.close()
"""


def as_users(script: str) -> str:
    ids = {"DAEMON_UID": DAEMON_UID, "DAEMON_GID": DAEMON_GID, "CLIENT_UID": CLIENT_UID}
    for name, value in ids.items():
        script = script.replace(name, str(value))
    return textwrap.dedent(script)


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder both users can reach (pytest's own is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="mcpd-regions-", dir="/tmp"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the daemon and the client as two other users")
def test_a_daemon_of_another_user_opens_the_clients_region(shared_folder: Path) -> None:
    scale(shared_folder / "m.onnx").chmod(0o644)
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "PYTHONDONTWRITEBYTECODE": "1"}
    daemon = subprocess.Popen(
        [sys.executable, "-c", as_users(DAEMON), str(shared_folder)],
        cwd=PROJECT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == "ready\n"
        client = subprocess.run(
            [
                sys.executable,
                "-c",
                as_users(CLIENT),
                str(shared_folder / "mcpd.sock"),
                f"/mcpd-test-{os.getpid()}",
            ],
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert client.returncode == 0, client.stderr
        refused, doubled = client.stdout.splitlines()
        assert refused.startswith("refused: 400 cannot open shared memory key '/mcpd-test-")
        assert refused.endswith(
            "-private': Permission denied (mcpd runs as its own user: give the object mode 0660 "
            "and mcpd's group, as mcpd.client's create_region does)"
        )
        assert doubled == "doubled: [0.0, 2.0, 4.0, 6.0]"
    finally:
        daemon.communicate(timeout=30)
