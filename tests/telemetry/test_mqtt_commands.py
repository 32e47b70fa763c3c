"""The command topic's allow-list: what runs, and the reason given for everything that does not;
what it takes, what it drops, and what it says, whatever arrives."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import paho.mqtt.client as paho
import pytest

from mcpd.telemetry.commands import answer
from mcpd.telemetry.inbound import (
    ANSWERS_IN_FLIGHT,
    BURST,
    FLOOD_BURST,
    FLOOD_PER_S,
    QUIET_S,
    RATE_PER_S,
    REDISCOVERY_PER_S,
    SAY_EVERY_S,
    CommandTopic,
    Inbound,
    Rediscover,
    Subscription,
    TokenBucket,
)
from mcpd.telemetry.topics import Topics


class Daemon:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((name, args))
        if args.get("name") == "unknown":
            return {"ok": False, "error": "no profile 'unknown'"}
        if args.get("name") == "boom":
            raise RuntimeError("governor lock timeout")
        return {"ok": True, "paused": name == "pause"}


def ask(name: str, payload: bytes, retained: bool = False) -> tuple[Any, Daemon]:
    daemon = Daemon()
    return json.loads(answer(name, payload, daemon, retained)[0]), daemon


def test_an_allowed_command_runs_and_its_result_is_the_reply() -> None:
    reply, daemon = ask("pause", b"")
    assert reply == {"command": "pause", "id": None, "ok": True, "result": {"paused": True}}
    assert daemon.calls == [("pause", {})]
    reply, daemon = ask("profile", b'{"id": "r-1", "args": {"name": "quiet"}}')
    assert reply["ok"] and reply["id"] == "r-1"
    assert daemon.calls == [("profile", {"name": "quiet"})]


@pytest.mark.parametrize(
    ("name", "payload", "error"),
    [
        ("reboot", b"", "unknown command 'reboot'; allowed: pause, profile, resume"),
        ("load_model", b'{"args": {"path": "/tmp/x.onnx"}}', "unknown command 'load_model'"),
        ("pause", b"{not json", "payload is not JSON"),
        ("pause", b"\xff\xfe", "payload is not JSON"),
        ("pause", b"[1, 2]", "payload must be a JSON object"),
        ("pause", b'{"args": {}, "exec": "sh"}', "unknown keys exec; expected id and args"),
        ("pause", b'{"args": []}', "args must be a JSON object"),
        ("pause", b'{"id": {"a": 1}}', "id must be an integer or a string"),
        ("pause", b'{"args": {"force": true}}', "args.force: unknown key; none is taken"),
        ("profile", b'{"args": {}}', "args.name: required key is missing"),
        ("profile", b'{"args": {"name": "../../etc"}}', "args.name: expected a string matching"),
        ("profile", b'{"args": {"name": 3}}', "args.name: expected a valid string, got 3"),
        ("pause", b" " * 5000, "payload too large (5000 bytes; at most 4096)"),
        ("pause", b"[" * 2000 + b"]" * 2000, "payload is not JSON: nested too deeply"),
        ("pause", b'{"id": 1e999}', "id must be an integer or a string"),
    ],
)
def test_anything_else_is_refused_with_the_reason_and_never_reaches_the_daemon(
    name: str, payload: bytes, error: str
) -> None:
    reply, daemon = ask(name, payload)
    assert reply["ok"] is False and error in reply["error"], reply
    assert daemon.calls == []


def test_a_retained_command_is_refused_because_it_would_run_at_every_reconnect() -> None:
    reply, daemon = ask("pause", b"", retained=True)
    assert not reply["ok"] and "retained" in reply["error"]
    assert daemon.calls == []


def test_the_daemons_refusal_and_failure_are_answers_too() -> None:
    reply, _ = ask("profile", b'{"id": 4, "args": {"name": "unknown"}}')
    assert reply == {"command": "profile", "id": 4, "ok": False, "error": "no profile 'unknown'"}
    reply, _ = ask("profile", b'{"args": {"name": "boom"}}')
    assert reply["ok"] is False and "governor lock timeout" in reply["error"]


def request(name: str, payload: bytes, topic: str = "") -> paho.MQTTMessage:
    message = paho.MQTTMessage(topic=(topic or f"mcpd/b1/cmd/{name}").encode())
    message.payload = payload
    return message


def test_a_token_bucket_takes_a_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=3)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert [bucket.take(0.5) for _ in range(2)] == [True, False]
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]


def test_requests_over_the_rate_are_dropped_unanswered_and_unparsed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    daemon = Daemon()
    topic = CommandTopic(daemon, Topics("mcpd", "b1"), v5=False)
    replies = [topic.request(request("pause", b""), "pause", now=0.0) for _ in range(BURST + 5)]
    assert all(reply is not None for reply in replies[:BURST])
    assert replies[BURST:] == [None] * 5
    assert len(daemon.calls) == BURST
    assert topic.request(request("pause", b""), "pause", now=1 / RATE_PER_S) is not None
    assert len(daemon.calls) == BURST + 1
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"a request over {RATE_PER_S:g}/s (burst {BURST}) dropped" in line


def test_rejections_are_logged_once_a_minute_with_how_many_went_unsaid(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = CommandTopic(Daemon(), Topics("mcpd", "b1"), v5=False)
    for n in range(BURST):
        reply = topic.request(request("pause", b"{not json"), "pause", now=n * 0.01)
        assert reply is not None and not json.loads(reply.payload)["ok"]
    assert topic.request(request("pause", b"[1]"), "pause", now=SAY_EVERY_S) is not None
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 2 and "payload is not JSON" in said[0]
    assert said[1].endswith(
        f"payload must be a JSON object ({BURST - 1} more since the last such line)"
    )


def test_answers_the_broker_has_not_taken_leave_no_room_for_more_requests() -> None:
    daemon = Daemon()
    topic = CommandTopic(daemon, Topics("mcpd", "b1"), v5=False)
    for mid in range(ANSWERS_IN_FLIGHT):
        assert topic.request(request("pause", b""), "pause", now=float(mid)) is not None
        topic.sent(mid)
    assert topic.request(request("pause", b""), "pause", now=100.0) is None
    assert len(daemon.calls) == ANSWERS_IN_FLIGHT  # dropped before it ran
    topic.acked(3)
    assert topic.request(request("pause", b""), "pause", now=101.0) is not None
    topic.sent(3)
    topic.lost()  # the connection went, and its answers with it
    assert topic.request(request("pause", b""), "pause", now=102.0) is not None


def test_a_flooded_subscription_is_left_for_a_while_and_taken_up_again() -> None:
    subscription = Subscription("mcpd/b1/cmd/+")
    assert all(subscription.admit(0.0) for _ in range(FLOOD_BURST))
    assert subscription.reopens_at(0.0) == math.inf
    assert not subscription.admit(0.0)  # the flood: left, and this message dropped unread
    assert not subscription.wanted(QUIET_S / 2) and not subscription.admit(QUIET_S / 2)
    assert subscription.reopens_at(QUIET_S / 2) == QUIET_S
    assert subscription.wanted(QUIET_S) and subscription.admit(QUIET_S)
    # A steady trickle under the flood's rate is never a flood.
    steady = Subscription("mcpd/b1/cmd/+")
    assert all(steady.admit(n / (FLOOD_PER_S / 2)) for n in range(10 * FLOOD_BURST))


def test_home_assistant_online_makes_the_configs_go_again_but_not_in_a_loop() -> None:
    inbound = Inbound(Topics("mcpd", "b1"), "homeassistant", None, v5=False)

    def rediscovers(payload: bytes, now: float) -> bool:
        status = request("", payload, topic="homeassistant/status")
        return isinstance(inbound.heard(status, now), Rediscover)

    assert rediscovers(b"online", 0.0)
    assert not rediscovers(b"offline", 0.0)
    seconds = 1.5 / REDISCOVERY_PER_S  # `online` at 10/s, for as long as 1.5 more take
    asked = sum(rediscovers(b"online", n / 10) for n in range(1, round(seconds * 10)))
    assert asked == 2 + 1  # what was left of the burst of 3, then the rate
    # Without a daemon to run them, commands are not even looked at.
    assert inbound.heard(request("pause", b""), 20.0) is None
