"""The command topic: a short allow-list of runtime commands, each checked, run and answered.

Request: publish to `<prefix>/<device>/cmd/<name>` an empty payload or a JSON object
`{"id": "…", "args": {…}}` (both keys optional; `id` is echoed). The answer goes to the request's
MQTT 5 Response Topic (with its Correlation Data) when it has one, else to
`<prefix>/<device>/cmd/<name>/reply`: `{"command", "id", "ok": true, "result": {…}}` or
`{"command", "id", "ok": false, "error": "…"}`. Nothing here takes a path, a model file or a shell
command, and nothing outside the allow-list reaches the daemon. What reaches this module at all,
and how often, is mcpd.telemetry.inbound's business.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.properties import Properties

from mcpd.config import ProfileName
from mcpd.schema import Invalid, build
from mcpd.telemetry.encoder import dumps
from mcpd.telemetry.mqtt_client import publish_properties

log = logging.getLogger("mcpd.telemetry")

Runner = Callable[[str, dict[str, Any]], dict[str, Any]]
MAX_PAYLOAD = 4096


@dataclass(frozen=True)
class NoArgs:
    pass


@dataclass(frozen=True)
class ProfileArgs:
    name: ProfileName
    """A governor profile the daemon knows; it answers with an error for any other."""


COMMANDS: dict[str, type] = {  # the one allow-list; the daemon runs these and no other
    "pause": NoArgs,  # hold the caps where they are
    "resume": NoArgs,
    "profile": ProfileArgs,
}


class Rejected(Exception):
    pass


def _request(payload: bytes) -> tuple[str | int | None, dict[str, Any]]:
    if len(payload) > MAX_PAYLOAD:
        raise Rejected(f"payload too large ({len(payload)} bytes; at most {MAX_PAYLOAD})")
    if not payload.strip():
        return None, {}
    try:
        request = json.loads(payload)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise Rejected(f"payload is not JSON: {exc}") from None
    except RecursionError:  # json's C decoder counts its depth against the recursion limit
        raise Rejected("payload is not JSON: nested too deeply") from None
    if not isinstance(request, dict):
        raise Rejected("payload must be a JSON object")
    unknown = sorted(set(request) - {"id", "args"})
    if unknown:
        raise Rejected(f"unknown keys {', '.join(unknown)}; expected id and args")
    ident = request.get("id")
    valid_id = isinstance(ident, int) and not isinstance(ident, bool)
    if not (ident is None or valid_id or (isinstance(ident, str) and len(ident) <= 64)):
        raise Rejected("id must be an integer or a string of at most 64 characters")
    args = request.get("args", {})
    if not isinstance(args, dict):
        raise Rejected("args must be a JSON object")
    return ident, args


def _validated(name: str, args: dict[str, Any]) -> dict[str, Any]:
    try:
        return dataclasses.asdict(build(COMMANDS[name], args))
    except Invalid as exc:
        raise Rejected("; ".join(f"args.{problem}" for problem in exc.problems)) from None


def answer(
    name: str, payload: bytes, run: Runner, retained: bool = False
) -> tuple[bytes, str | None]:
    """The reply to one request, and why it was refused (None when it ran). Never raises: every
    failure is an answer that says why; a failure of the daemon is logged with its traceback."""
    ident: str | int | None = None
    try:
        if name not in COMMANDS:
            raise Rejected(f"unknown command {name!r}; allowed: {', '.join(sorted(COMMANDS))}")
        ident, args = _request(payload)
        if retained:
            raise Rejected("retained command refused: it would run again at every reconnect")
        result = run(name, _validated(name, args))
        if result.get("ok", True) is False:
            raise Rejected(str(result.get("error", "refused by the daemon")))
    except Rejected as exc:
        reply = {"command": name, "id": ident, "ok": False, "error": str(exc)}
        return dumps(reply), str(exc)
    except Exception as exc:  # admitted requests only (inbound.RATE_PER_S)
        log.exception("command %r failed", name)
        return dumps({"command": name, "id": ident, "ok": False, "error": f"failed: {exc}"}), None
    log.info("command %r done", name)
    result = {key: value for key, value in result.items() if key != "ok"}
    return dumps({"command": name, "id": ident, "ok": True, "result": result}), None


@dataclass(frozen=True)
class Reply:
    topic: str
    payload: bytes
    properties: Properties | None


def addressed(message: paho.MQTTMessage, reply: bytes, default_topic: str, v5: bool) -> Reply:
    """The answer goes to the request's Response Topic, with its Correlation Data (MQTT 5)."""
    request = message.properties if v5 else None
    topic = getattr(request, "ResponseTopic", "") or default_topic
    if any(c in topic for c in "+#\0"):
        topic = default_topic  # a wildcard is no place to publish to
    if request is None:
        return Reply(topic, reply, None)
    properties = publish_properties(None)
    correlation = getattr(request, "CorrelationData", None)
    if correlation:
        properties.CorrelationData = correlation
    return Reply(topic, reply, properties)
