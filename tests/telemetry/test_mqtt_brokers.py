"""`[mqtt] brokers`: the list, each board's own order over it, the move to the next broker when one
goes (with TLS checked against each broker's own name), and where the status says the board is."""

from __future__ import annotations

import collections
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from mcpd.brokers import Broker, order, parse
from mcpd.config import ConfigError
from mcpd.config import parse as parse_config
from mcpd.ctl.status import format_status
from mcpd.telemetry.link import Link
from mcpd.telemetry.topics import Topics
from tests.support.mqtt_broker import (
    Mosquitto,
    free_port,
    make_certificates,
    mosquitto_binary,
    publishing,
    recording,
    server_certificate,
    settings,
)
from tests.support.waiting import wait_until

T = "mcpd/b1/telemetry"
needs_mosquitto = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto not installed")


def problems(mqtt: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config({"mqtt": mqtt})
    return caught.value.problems


def test_host_and_port_are_a_list_of_one_and_brokers_a_list_of_several() -> None:
    assert parse_config({}).mqtt.addresses() == (Broker("localhost", 1883),)
    assert parse_config({"mqtt": {"port": 8883}}).mqtt.addresses() == (Broker("localhost", 8883),)
    assert parse_config({"mqtt": {"host": "b.lan"}}).mqtt.addresses() == (Broker("b.lan", 1883),)
    listed = parse_config({"mqtt": {"brokers": ["n1.lan:1883", "10.0.0.2:1884", "[fd00::3]:1"]}})
    assert listed.mqtt.addresses() == (
        Broker("n1.lan", 1883),
        Broker("10.0.0.2", 1884),
        Broker("fd00::3", 1),
    )
    assert [str(b) for b in listed.mqtt.addresses()] == [
        "n1.lan:1883",
        "10.0.0.2:1884",
        "[fd00::3]:1",
    ]


def test_a_broker_list_beside_host_or_port_and_each_malformed_entry_are_named() -> None:
    both = "mqtt: brokers and host/port are both set: list every broker in brokers"
    assert problems({"brokers": ["a:1"], "host": "b"}) == [both]
    assert problems({"brokers": ["a:1"], "port": 1883}) == [both]
    assert problems({"brokers": ["a:1", "b"]}) == [
        "mqtt: brokers[1]: 'b' is not HOST:PORT (e.g. broker-1.lan:1883)"
    ]
    assert problems({"brokers": ["a:99999"]}) == [
        "mqtt: brokers[0]: 'a:99999': the port must be a number from 1 to 65535"
    ]
    assert problems({"brokers": ["fd00::1:1883"]}) == [
        "mqtt: brokers[0]: 'fd00::1:1883': an IPv6 address goes in brackets, e.g. [fd00::1]:1883"
    ]
    assert problems({"brokers": ["bad_host:1"]}) == [
        "mqtt: brokers[0]: 'bad_host:1': 'bad_host' is not a host name or an IP address"
    ]
    assert problems({"heartbeat_s": 0}) == [
        "mqtt.heartbeat_s: expected greater than or equal to 1, got 0"
    ]


def test_each_board_has_an_order_of_its_own_and_a_fleet_spreads_over_the_list() -> None:
    nodes = tuple(parse(f"node-{i}.lan:1883") for i in range(3))
    assert order(nodes, "board-7") == order(nodes, "board-7")  # the same at every start
    assert sorted(order(nodes, "board-7"), key=str) == list(nodes)
    firsts = collections.Counter(order(nodes, f"b{i:04d}")[0] for i in range(3000))
    assert set(firsts) == set(nodes)
    assert all(900 <= count <= 1100 for count in firsts.values()), firsts
    seconds = collections.Counter(
        order(nodes, f"b{i:04d}")[1]
        for i in range(3000)
        if order(nodes, f"b{i:04d}")[0] == nodes[0]
    )
    assert set(seconds) == {nodes[1], nodes[2]}  # a lost node's boards do not all move to one


def test_the_link_tries_the_next_broker_of_its_order_at_each_attempt(tmp_path: Path) -> None:
    """Each attempt fails before it connects (its password file cannot be read), so the link's
    steps alone walk the schedule."""
    listed = ["n1.lan:1883", "n2.lan:1883", "n3.lan:1883"]
    mqtt = parse_config(
        {
            "mqtt": {
                "enabled": True,
                "brokers": listed,
                "username": "board",
                "password_file": str(tmp_path / "missing"),
            }
        }
    ).mqtt
    link = Link(mqtt, Topics("mcpd", "b1"), lambda: None, 0.0)
    tried, now = [], 0.0
    for _ in range(6):
        now = link.step(now, 0)
        tried.append(link.address)
    mine = [str(b) for b in order(mqtt.addresses(), "b1")]
    assert tried == mine + mine


def test_mcpctl_status_says_which_broker_telemetry_goes_to_and_since_when() -> None:
    def lines(mqtt: object) -> list[str]:
        return [line for line in format_status({"mqtt": mqtt}).splitlines() if "mqtt" in line]

    since = 1767225600.5
    assert lines({"broker": "n2.lan:1883", "since": since}) == [
        "mqtt         n2.lan:1883 since 2026-01-01T00:00:00+00:00"
    ]
    assert lines({"broker": None, "since": None}) == ["mqtt         not connected (spooling)"]
    assert lines(None) == []  # MQTT off


@needs_mosquitto
def test_a_board_moves_to_the_next_broker_when_its_own_goes_and_loses_nothing(
    tmp_path: Path,
) -> None:
    with (
        Mosquitto(tmp_path / "a") as a,
        Mosquitto(tmp_path / "b") as b,
        recording(a, "mcpd/b1/telemetry") as on_a,
        recording(b, "mcpd/b1/telemetry") as on_b,
    ):
        by_port = {a.port: a, b.port: b}
        mqtt = settings(a, brokers=[f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"])
        first, second = order(mqtt.addresses(), "b1")
        (on_first, on_second) = (on_a, on_b) if first.port == a.port else (on_b, on_a)
        with publishing(mqtt, tmp_path / "board") as publisher:
            on_first.wait_for("mcpd/b1/telemetry", 3)
            assert publisher.connection["broker"] == str(first)
            since = publisher.connection["since"]
            assert since is not None and abs(since - time.time()) < 10
            by_port[first.port].stop()
            on_second.wait_for("mcpd/b1/telemetry", 3)
            assert publisher.connection["broker"] == str(second)
            moved = publisher.connection["since"]
            assert moved is not None and moved > since
    seqs = [m.json()["seq"] for m in on_first.messages + on_second.messages]
    assert sorted(seqs) == list(range(seqs[0], seqs[0] + len(seqs)))  # no gap, no duplicate


@needs_mosquitto
def test_tls_checks_each_broker_against_its_own_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One broker's certificate names only `localhost`, the other's only 127.0.0.1: a board on
    both lists connects to each, and a name that is not the certificate's is refused."""
    tls = make_certificates(tmp_path / "tls")
    by_name = server_certificate(tls, "by-name", "DNS:localhost")
    by_address = server_certificate(tls, "by-address", "IP:127.0.0.1")
    board_tls = {
        "enabled": True,
        "ca_file": str(tls.ca),
        "cert_file": str(tls.client_cert),
        "key_file": str(tls.client_key),
    }
    with (
        Mosquitto(tmp_path / "a", tls=by_name) as a,
        Mosquitto(tmp_path / "b", tls=by_address) as b,
        caplog.at_level(logging.WARNING, "mcpd.telemetry"),
    ):
        listed = [f"localhost:{a.port}", f"127.0.0.1:{b.port}"]
        mqtt = settings(a, brokers=listed, tls=board_tls)
        first, second = order(mqtt.addresses(), "b1")
        brokers = {a.port: a, b.port: b}
        with (
            recording(brokers[first.port], T, host=first.host) as on_first,
            recording(brokers[second.port], T, host=second.host) as on_second,
            publishing(mqtt, tmp_path / "board"),
        ):
            on_first.wait_for(T)
            brokers[first.port].stop()
            on_second.wait_for(T)
        assert "certificate" not in caplog.text
        brokers[first.port].start()
        wrong = [f"127.0.0.1:{a.port}"]  # a's certificate does not name 127.0.0.1
        with publishing(settings(a, brokers=wrong, tls=board_tls), tmp_path / "board"):
            wait_until(
                lambda: "broker certificate not trusted" in caplog.text, 15, "the refusal logged"
            )
    assert "IP address mismatch" in caplog.text


def test_test_ports_are_outside_the_range_of_outgoing_connections_and_never_repeat() -> None:
    """A cluster node restarted on its port must find it free (tests/support/mqtt_clusters.py):
    a port the kernel may give a client's connection meanwhile was taken in a bench run."""
    ports = [free_port() for _ in range(500)]
    outgoing = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert len(set(ports)) == len(ports)
    assert all(10_000 <= port < outgoing for port in ports)
