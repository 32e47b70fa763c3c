"""The `[serving] http` TCP listener: refused off loopback unless allowed, bound by the governor so it
outlives serving restarts, the same protocol as the socket, and shared memory only for a client
whose user the kernel names (docs/serving-protocol.md §8)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mcpd import config as config_module
from mcpd.demo import MODEL
from mcpd.listen import SocketError, bind_tcp, tcp_address
from mcpd.serving.connections import Acceptor
from mcpd.serving.peers import Peers
from tests.support.daemon import RunningDaemon, mcpd_run, new_child, serving_pid, simulated
from tests.support.mqtt_broker import free_port
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config


def parse_serving(**serving: object) -> config_module.Config:
    return config_module.parse({"serving": serving})


@pytest.mark.parametrize("address", ["127.0.0.1:8000", "127.1.2.3:80", "[::1]:8000", "localhost:1"])
def test_a_loopback_address_is_taken(address: str) -> None:
    assert parse_serving(http=address).serving.http == address


def test_http_is_off_by_default() -> None:
    assert config_module.Config().serving.http == ""


@pytest.mark.parametrize("address", ["0.0.0.0:8000", "192.168.1.5:8000", "[::]:8000"])
def test_a_non_loopback_address_is_refused_unless_allowed(address: str) -> None:
    with pytest.raises(config_module.ConfigError) as refused:
        parse_serving(http=address)
    (problem,) = refused.value.problems
    assert problem.startswith(f"serving: http = {address!r} is not a loopback address")
    assert "allow_remote_http = true" in problem
    assert parse_serving(http=address, allow_remote_http=True).serving.http == address


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("8000", "is not HOST:PORT"),
        ("myhost:8000", "'myhost' is not an IP address"),
        ("127.0.0.1:0", "the port must be a number from 1 to 65535"),
        ("127.0.0.1:65536", "the port must be a number from 1 to 65535"),
        ("127.0.0.1:８０", "the port must be a number"),
        ("::1:8000", "an IPv6 address goes in brackets"),
    ],
)
def test_a_malformed_address_is_named(address: str, why: str) -> None:
    with pytest.raises(config_module.ConfigError) as refused:
        parse_serving(http=address)
    (problem,) = refused.value.problems
    assert problem.startswith(f"serving: http: {address!r}") and why in problem


def test_a_port_in_use_is_named_with_its_key() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SocketError, match=rf"cannot listen on 127.0.0.1:{port} \(\[serving\] "
                           r"http\): Address already in use"):  # fmt: skip
            bind_tcp(tcp_address(f"127.0.0.1:{port}"), "[serving] http")


class _Transport:
    """What Peers reads of an asyncio transport: its socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str) -> object:
        return self.sock if name == "socket" else None


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_a_loopback_tcp_peer_is_the_user_that_made_its_socket(
    family: int, host: str, tmp_path: Path
) -> None:
    listener = bind_tcp(tcp_address(f"{'[::1]' if ':' in host else host}:{free_port()}"), "test")
    listener.setblocking(True)
    with listener, socket.socket(family) as client:
        client.connect(listener.getsockname()[:2])
        accepted, _ = listener.accept()
        with accepted:
            assert Peers().uid(_Transport(accepted)) == os.getuid()  # type: ignore[arg-type]
            # A namespace that lists no such connection names nobody.
            for table in ("tcp", "tcp6"):
                (tmp_path / table).write_text("  sl  local_address rem_address   st\n")
            assert Peers(str(tmp_path)).uid(_Transport(accepted)) is None  # type: ignore[arg-type]


def test_a_unix_socket_peer_is_looked_up_once_per_connection() -> None:
    server, client = socket.socketpair(socket.AF_UNIX)
    transport = _Transport(server)
    peers = Peers()
    with client:
        assert peers.uid(transport) == os.getuid()  # type: ignore[arg-type]
        server.close()  # SO_PEERCRED would now fail: the answer is the one kept
        assert peers.uid(transport) == os.getuid()  # type: ignore[arg-type]
    assert Peers().uid(None) is None


def test_tcp_connections_send_small_writes_at_once() -> None:
    """TCP_NODELAY on every accepted TCP connection: a response is more than one write, and Nagle
    would hold the last one for the client's delayed ACK."""

    class Kept(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.set_result(transport)

    async def main() -> int:
        listener = bind_tcp(tcp_address(f"127.0.0.1:{free_port()}"), "test")
        acceptor = Acceptor([listener], Kept, lambda: 10)
        acceptor.start()
        _, writer = await asyncio.open_connection(*listener.getsockname())
        transport = await asyncio.wait_for(made, 10)
        nodelay = transport.get_extra_info("socket").getsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY
        )
        writer.close()
        transport.close()
        acceptor.stop()
        listener.close()
        return int(nodelay)

    made: asyncio.Future[asyncio.BaseTransport]
    loop = asyncio.new_event_loop()
    made = loop.create_future()
    try:
        assert loop.run_until_complete(main()) == 1
    finally:
        loop.close()


@pytest.fixture
def over_tcp(tmp_path: Path) -> Iterator[tuple[Served, int]]:
    port = free_port()
    model = {"name": "m", "path": str(scale(tmp_path / "scale.onnx"))}
    served = Served(config(tmp_path, [model], http=f"127.0.0.1:{port}"))
    served.wait_settled()
    yield served, port
    served.close()


def request(port: int, method: str, path: str, body: object = None) -> tuple[int, object]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=data)
        response = connection.getresponse()
        text = response.read()
        return response.status, json.loads(text) if text else None
    finally:
        connection.close()


def test_the_socket_and_the_tcp_listener_serve_the_same(over_tcp: tuple[Served, int]) -> None:
    served, port = over_tcp
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    status, answer = request(port, "POST", "/v2/models/m/infer", body)
    assert status == 200 and isinstance(answer, dict)
    assert answer["outputs"][0]["data"] == [2, 4, 6, 8]
    with served.client() as client:
        doubled = client.infer("m", {"x": np.array([[1, 2, 3, 4]], np.float32)})["double"]
    np.testing.assert_array_equal(doubled, [[2, 4, 6, 8]])
    assert request(port, "GET", "/v2/models/nope")[0] == 404


def _shm_object(uid: int) -> tuple[str, Path]:
    key = f"mcpd-tcp-test-{os.getpid()}-{uid}-{time.monotonic_ns()}"
    path = Path("/dev/shm") / key
    path.write_bytes(bytes(64))
    os.chown(path, uid, -1)
    return key, path


REGISTER = """
import http.client, json, sys
port, key = int(sys.argv[1]), sys.argv[2]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
c.request("POST", "/v2/systemsharedmemory/region/r-" + key + "/register",
          json.dumps({"key": key, "byte_size": 64}))
r = c.getresponse()
print(r.status, r.read().decode())
"""


def _register_as(uid: int, port: int, key: str) -> str:
    # The system's interpreter: the test's may sit where another user cannot reach it.
    done = subprocess.run([SYSTEM_PYTHON, "-c", REGISTER, str(port), key], user=uid, cwd="/",
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.strip()


SYSTEM_PYTHON = "/usr/bin/python3"  # tests/run installs it (python3)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_over_tcp_a_user_registers_only_its_own_shared_memory(
    over_tcp: tuple[Served, int],
) -> None:
    _, port = over_tcp
    user = 12345
    own, own_path = _shm_object(user)
    roots, roots_path = _shm_object(0)
    try:
        assert _register_as(user, port, own) == "200"
        refused = _register_as(user, port, roots)
        assert refused.startswith("400") and "belongs to another user" in refused
        # Root sees every region (the rule of the Unix socket too).
        assert [r["key"] for r in request(port, "GET", "/v2/systemsharedmemory/status")[1]] == [own]  # type: ignore[union-attr]
    finally:
        own_path.unlink()
        roots_path.unlink()


def test_the_governor_holds_the_tcp_listener_across_serving_restarts(tmp_path: Path) -> None:
    """The next serving process answers on the same port; during a crash loop the governor's
    stand-in answers it, as it answers the socket."""
    port = free_port()
    sock = tmp_path / "mcpd.sock"
    daemon = RunningDaemon(
        tmp_path,
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[serving]\nhttp = "127.0.0.1:{port}"\n'
        f'[[models]]\nname = "demo"\npath = "{MODEL}"\n',
    )
    try:
        daemon.wait_for(lambda: _ready_over_tcp(port), 60)
        assert f"serving the Open Inference Protocol on {sock} and 127.0.0.1:{port}" in (
            daemon.log.read_text()
        )
        child = serving_pid(sock)
        for restarts in range(1, 5):  # quick exits: restarts after 0, 0.5, 1, then 2 s
            os.kill(child, signal.SIGKILL)
            child = new_child(daemon, sock, child)
            status, document = request(port, "GET", "/v2/mcpd/status")
            assert status == 200 and isinstance(document, dict)
            assert document["serving"]["restarts"] == restarts
            assert document["serving"]["pid"] == child
        os.kill(child, signal.SIGKILL)  # the fifth in a row: 4 s until the next start
        daemon.wait_for(lambda: "next start in 4 s" in daemon.log.read_text(), 10)
        status, document = request(port, "GET", "/v2/mcpd/status")
        assert status == 200 and isinstance(document, dict)
        assert document["serving"]["state"] == "restarting"
        assert request(port, "POST", "/v2/models/demo/infer", {})[0] == 503
    finally:
        daemon.close()


def _ready_over_tcp(port: int) -> bool:
    try:
        return request(port, "GET", "/v2/models/demo/ready")[0] == 200
    except OSError:
        return False


def test_a_port_in_use_stops_the_daemon_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config_file = tmp_path / "mcpd.toml"
        config_file.write_text(
            f'[daemon]\nsocket = "{tmp_path / "mcpd.sock"}"\nstate_dir = "{tmp_path / "s"}"\n'
            f'[serving]\nhttp = "127.0.0.1:{port}"\n'
        )
        done = subprocess.run(
            mcpd_run(config_file, *simulated("rk3588", tmp_path / "board")),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"mcpd run: cannot listen on 127.0.0.1:{port} ([serving] http): Address already in use"
    )
    assert "baseline caps restored" in done.stderr
