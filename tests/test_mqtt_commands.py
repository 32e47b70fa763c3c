"""The command topic's allow-list: what runs, and the reason given for everything that does not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcpd.telemetry.commands import answer


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
    return json.loads(answer(name, payload, daemon, retained)), daemon


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
