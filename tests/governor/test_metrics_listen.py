"""`[metrics] listen`: refused off loopback unless allowed, bound by the governor so that a scrape
during a serving restart waits and is answered, only /metrics on it, and during a crash loop a 503
from the governor's stand-in."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from mcpd import config as config_module
from mcpd.governor.standin import HEAD_S, MAX_CONNECTIONS, StandIn
from mcpd.listen import SocketError, bind_tcp, bind_tcp_listeners, tcp_address
from mcpd.serving.service import METRICS_CONNECTIONS
from tests.support.clock import FakeClock
from tests.support.mqtt_broker import free_port
from tests.support.serving_server import Served, config
from tests.support.standin import ask
from tests.support.waiting import wait_until


def parse_metrics(**metrics: object) -> config_module.Config:
    return config_module.parse({"metrics": metrics})


def test_off_by_default() -> None:
    config = config_module.Config()
    assert config.metrics.listen == "" and config_module.tcp_listeners(config) == {}


@pytest.mark.parametrize("address", ["127.0.0.1:9101", "[::1]:9101", "localhost:9101"])
def test_a_loopback_address_is_taken(address: str) -> None:
    config = parse_metrics(listen=address)
    assert config_module.tcp_listeners(config) == {"metrics": (address, "[metrics] listen")}


@pytest.mark.parametrize("address", ["0.0.0.0:9101", "10.0.0.7:9101", "[::]:9101"])
def test_a_non_loopback_address_is_refused_unless_allowed(address: str) -> None:
    with pytest.raises(config_module.ConfigError) as refused:
        parse_metrics(listen=address)
    (problem,) = refused.value.problems
    assert problem.startswith(f"metrics: listen = {address!r} is not a loopback address")
    assert "read the board's metrics" in problem and "allow_remote = true" in problem
    assert parse_metrics(listen=address, allow_remote=True).metrics.listen == address


def test_a_malformed_address_is_named() -> None:
    with pytest.raises(config_module.ConfigError) as refused:
        parse_metrics(listen="9101")
    (problem,) = refused.value.problems
    assert problem.startswith("metrics: listen: '9101' is not HOST:PORT")


def test_a_listener_that_cannot_be_bound_closes_those_bound_before_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy, free = taken.getsockname()[1], free_port()
        wanted = {"http": (f"127.0.0.1:{free}", "[serving] http"),
                  "metrics": (f"127.0.0.1:{busy}", "[metrics] listen")}  # fmt: skip
        with pytest.raises(SocketError, match=r"\(\[metrics\] listen\): Address already in use"):
            bind_tcp_listeners(wanted)
    bind_tcp(tcp_address(f"127.0.0.1:{free}"), "again").close()  # the first one was closed


def test_during_a_crash_loop_the_metrics_port_answers_503_and_nothing_else(tmp_path: Path) -> None:
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "s.sock"))
    unix.listen()
    unix.setblocking(False)  # as the governor holds it
    port = free_port()
    metrics = bind_tcp(tcp_address(f"127.0.0.1:{port}"), "[metrics] listen")
    status = {"temperature_c": 70.0}
    standin = StandIn([unix], lambda: status, lambda: ("the serving process exited (signal SIGSEGV)", 4.0),
                      FakeClock(100.0), metrics=metrics)  # fmt: skip
    try:
        scrape = ask(standin, ("127.0.0.1", port), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert scrape.startswith("HTTP/1.1 503 ")
        assert "Retry-After: 4\r\n" in scrape and "SIGSEGV" in scrape
        other = ask(standin, ("127.0.0.1", port), b"GET /v2/mcpd/status HTTP/1.1\r\n\r\n")
        assert other.startswith("HTTP/1.1 404 ") and "serves only GET /metrics" in other
        # The socket's status is still the governor's document.
        document = ask(standin, str(tmp_path / "s.sock"), b"GET /v2/mcpd/status HTTP/1.1\r\n\r\n")
        assert document.startswith("HTTP/1.1 200 ") and document.endswith('{"temperature_c": 70.0}')
    finally:
        standin.close()
        unix.close()
        metrics.close()


def test_clients_that_do_not_read_cannot_hold_the_stand_in(tmp_path: Path) -> None:
    """The stand-in answers each connection once without waiting to send, reads and drops what
    follows, and drops each connection HEAD_S after it came (the oldest at once past
    MAX_CONNECTIONS): a client that pipelines requests and reads nothing holds nothing."""
    path = str(tmp_path / "s.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(path)
    unix.listen(MAX_CONNECTIONS + 16)
    unix.setblocking(False)
    clock = FakeClock(100.0)
    standin = StandIn([unix], lambda: {"temperature_c": 70.0}, lambda: ("exited", 4.0), clock)
    hogs = []
    try:
        for _ in range(MAX_CONNECTIONS + 8):
            hog = socket.socket(socket.AF_UNIX)
            hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            hog.connect(path)
            hog.sendall(b"GET /v2/mcpd/status HTTP/1.1\r\n\r\n" * 200)
            hogs.append(hog)
        document = ask(standin, path, b"GET /v2/mcpd/status HTTP/1.1\r\n\r\n")
        assert document.startswith("HTTP/1.1 200 ") and document.endswith('{"temperature_c": 70.0}')
        assert len(standin.fds()) <= 1 + MAX_CONNECTIONS
        clock.now += HEAD_S
        standin.expire()
        assert standin.fds() == [unix.fileno()]
    finally:
        standin.close()
        for hog in hogs:
            hog.close()
        unix.close()


def test_the_metrics_port_has_a_connection_cap_of_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    served = Served(config(tmp_path, [], metrics=f"127.0.0.1:{port}", max_connections=2))
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(METRICS_CONNECTIONS)]
        with socket.create_connection(("127.0.0.1", port)) as waiting:
            waiting.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            scrapes = served.service.scrapes
            assert scrapes is not None
            # the ninth waits in the backlog
            wait_until(lambda: scrapes.capped, 10, "the scrapes capped", interval=0.01)
            assert scrapes.open == METRICS_CONNECTIONS
            with served.client() as client:  # the socket's cap (2) does not count them
                assert client.live()
            idle.pop().close()  # one closes: the waiting scrape is taken and answered
            waiting.settimeout(10)
            assert waiting.recv(65536).startswith(b"HTTP/1.1 200")
        for sock in idle:
            sock.close()
    finally:
        served.close()
    capped = [r.getMessage() for r in caplog.records if "new connections wait" in r.getMessage()]
    assert capped == [f"{METRICS_CONNECTIONS} client connections are open, the cap (the "
                      "[metrics] listen port's): new connections wait until one closes"]  # fmt: skip
